"""What a Python worker tells the servers of its training, with each step
and each report(): psctl status and /metrics show Python workers as they
show ps_worker.
"""

import time


class Progress:
    """One worker's counters for the servers' heartbeats (client.report).

    Not thread-safe: the optimizer's thread uses it.
    """

    def __init__(self, client):
        self._client = client
        self.samples = 0
        self.loss = 0.0
        # Seconds step() spent in the client's calls (the network and the
        # servers).
        self.exchange_seconds = 0.0
        self._rate = (time.perf_counter(), 0)  # Since when, samples then.
        self._samples_per_second = 0.0
        self.steps = 0  # step() calls.
        self._step_rate = (time.perf_counter(), 0)  # Since when, steps then.
        self.steps_per_second = 0.0

    def add(self, loss=None, samples=0):
        """Takes a step's loss (if not None) and the examples it trained
        on, and sends the counters."""
        if loss is not None:
            self.loss = float(loss)
        self.samples += int(samples)
        now = time.perf_counter()
        since, then = self._rate
        if now - since >= 1.0:
            self._samples_per_second = (self.samples - then) / (now - since)
            self._rate = (now, self.samples)
        self.send()

    def step(self):
        """Counts one step(); every second or so, its rate is measured
        anew and sent (an outer optimizer's dynamic rounds use it)."""
        self.steps += 1
        now = time.perf_counter()
        since, then = self._step_rate
        if now - since >= 1.0:
            self.steps_per_second = (self.steps - then) / (now - since)
            self._step_rate = (now, self.steps)
            self.send()

    def send(self):
        """Sends the counters as they are."""
        self._client.report(samples=self.samples,
                            samples_per_second=self._samples_per_second,
                            loss=self.loss,
                            exchange_seconds=self.exchange_seconds,
                            steps_per_second=self.steps_per_second)
