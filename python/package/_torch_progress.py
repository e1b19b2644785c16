"""What a Python worker tells the servers of its training, with each step
and each report(): psctl status and /metrics show Python workers as they
show ps_worker.
"""

import time


class _Rate:
    """A growing count's rate a second, measured anew once a second or
    more has passed since the last measure."""

    def __init__(self):
        self._since = (time.perf_counter(), 0)  # When, and the count then.
        self.per_second = 0.0

    def update(self, count):
        """Measures the rate if a second has passed; True if it did."""
        now = time.perf_counter()
        since, then = self._since
        if now - since < 1.0:
            return False
        self.per_second = (count - then) / (now - since)
        self._since = (now, count)
        return True


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
        self._samples_rate = _Rate()
        self.steps = 0  # step() calls counted.
        self._steps_rate = _Rate()

    @property
    def steps_per_second(self):
        return self._steps_rate.per_second

    def add(self, loss=None, samples=0):
        """Takes a step's loss (if not None) and the examples it trained
        on, and sends the counters."""
        if loss is not None:
            self.loss = float(loss)
        self.samples += int(samples)
        self._samples_rate.update(self.samples)
        self.send()

    def step(self):
        """Counts one step(); once its rate is measured anew (every second
        or so), sends it (an outer optimizer's dynamic rounds use it)."""
        self.steps += 1
        if self._steps_rate.update(self.steps):
            self.send()

    def send(self):
        """Sends the counters as they are."""
        self._client.report(
            samples=self.samples,
            samples_per_second=self._samples_rate.per_second,
            loss=self.loss, exchange_seconds=self.exchange_seconds,
            steps_per_second=self.steps_per_second)
