"""Local steps with an outer optimizer on the servers, for
DistributedOptimizer(..., outer=...): the wrapped optimizer runs on the
worker (its state stays there) for `local_steps` steps, then one exchange
with the servers (docs/MODES.md "Outer optimizers"):

- "diloco" (Douillard et al. 2023): the worker pushes its pseudo-gradient,
  the weights it started the round from less its own now; the servers take
  an outer Nesterov step. In bsp the step is on the mean over the ranks
  (synchronous DiLoCo: the servers' momentum kind with nesterov); in async
  and ssp each push is applied as it comes, with delayed Nesterov momentum
  (Liu et al. 2024: the servers' delayed_nesterov kind, one momentum update
  per `num_workers` pushes).
- "easgd" (Zhang, Choromanska, LeCun 2015, asynchronous EASGD): the worker
  pushes its weights x, the servers move the centre by alpha * (x - centre)
  and answer with it, and the worker moves by as much the other way:
  x -= alpha / (1 - alpha) * (x - new centre), which is alpha * (x - the
  centre it met). async and ssp only.

Pure bookkeeping here; DistributedOptimizer talks to the client.
"""

import math
import time

import numpy as np
import torch

OUTERS = ("diloco", "easgd")


def _number(name, value, low, high, low_open=False, high_open=True):
    """`value` as a float if finite and in the interval, else ValueError
    naming `name`."""
    ok = isinstance(value, (int, float)) and math.isfinite(value)
    if ok:
        ok = (value > low if low_open else value >= low) and (
            value < high if high_open else value <= high)
    if not ok:
        interval = (("(" if low_open else "[") + f"{low}, {high}" +
                    (")" if high_open else "]"))
        raise ValueError(f"{name} = {value!r} (must be in {interval})")
    return float(value)


class Outer:
    """One worker's local-steps schedule and its outer optimizer's
    arithmetic. Not thread-safe: the optimizer's thread uses it."""

    def __init__(self, outer, mode, num_workers, local_steps, outer_lr,
                 outer_momentum, alpha, dynamic=False, rates=None):
        """ValueError for an unknown `outer`, local_steps < 1, a learning
        rate, momentum or alpha out of range, easgd in bsp (or any outer
        optimizer in allreduce), or `dynamic` other than with diloco in
        async. `dynamic`: each round takes local_steps scaled by this
        worker's rate over the job's fastest (DynamicRoundSteps), the two
        from `rates()` as (mine, fastest) steps a second."""
        if outer not in OUTERS:
            raise ValueError(f"outer = {outer!r} (want one of {OUTERS})")
        if (isinstance(local_steps, bool) or not isinstance(local_steps, int)
                or local_steps < 1):
            raise ValueError(
                f"local_steps = {local_steps!r} (must be an integer >= 1)")
        if mode not in ("async", "ssp", "bsp"):
            raise ValueError(f"outer={outer!r} runs in async, ssp and bsp, "
                             f"not in mode {mode!r}")
        if outer == "easgd" and mode == "bsp":
            raise ValueError(
                "outer='easgd' is asynchronous EASGD (async, ssp); for a "
                "synchronous outer step use outer='diloco' in bsp")
        if dynamic and (outer != "diloco" or mode != "async"):
            raise ValueError(
                "dynamic_local_steps is asynchronous DiLoCo's: outer="
                "'diloco' in mode async (ssp's bound and bsp's steps count "
                "rounds)")
        self.outer = outer
        self.mode = mode
        self.local_steps = local_steps
        self.dynamic = bool(dynamic)
        self._rates = rates
        self.round_steps = local_steps  # This round's.
        self._done = 0  # Local steps since the last exchange.
        if outer == "diloco":
            self.lr = _number("outer_lr", outer_lr, 0, math.inf,
                              low_open=True)
            self.momentum = _number("outer_momentum", outer_momentum, 0, 1)
            if mode == "bsp":
                self.kind = "momentum"
                self.hyper = {"lr": self.lr, "momentum": self.momentum,
                              "nesterov": True, "dampening": 0.0,
                              "weight_decay": 0.0}
            else:
                self.kind = "delayed_nesterov"
                self.hyper = {"lr": self.lr, "momentum": self.momentum,
                              "delay": max(1, int(num_workers))}
        else:
            if alpha is None:  # The paper's beta = 0.9 over the workers.
                alpha = 0.9 / max(1, int(num_workers))
            self.alpha = _number("alpha", alpha, 0, 1, low_open=True)
            self.kind = "elastic"
            self.hyper = {"lr": self.alpha}
        self._anchor = {}  # name -> the weights the round started from.

    def start_round(self, weights):
        """Keeps `weights` ({name: float32 array}) as the round's start."""
        self._anchor = {n: np.array(w, dtype=np.float32, copy=True)
                        for n, w in weights.items()}

    def due(self):
        """Counts one local step; True when it ends a round (and then,
        with `dynamic`, sizes the next one)."""
        self._done += 1
        if self._done < self.round_steps:
            return False
        self._done = 0
        if self.dynamic and self._rates is not None:
            self.round_steps = dynamic_round_steps(self.local_steps,
                                                   *self._rates())
        return True

    def pushed(self, local):
        """What the worker pushes, by name, for its local weights `local`
        ({name: float32 array}, left as they are)."""
        if self.outer == "diloco":
            return {n: self._anchor[n] - w for n, w in local.items()}
        return {n: np.array(w, dtype=np.float32, copy=True)
                for n, w in local.items()}

    def exchange(self, client, staging, params, buffers, recover):
        """The end of a round: pushes what the outer optimizer takes (a
        pseudo-gradient, or the weights) for `params` ({name: parameter})
        and the values of `buffers` (averaged in), and leaves the servers'
        answer, as the outer optimizer makes it the worker's, in the
        parameters (through `staging`, the optimizer's HostTensors). On a
        failed call, `recover()` (the optimizer's _recover) says whether a
        shard that lost the model got it back; in bsp the round is pushed
        again, elsewhere it is lost where it was not applied. Returns the
        seconds spent in the client's calls."""
        names = list(params)
        sent = self.pushed(local_weights(params))
        out = staging.arrays(names)  # May be the parameters themselves.
        hyper = {n: self.hyper for n in sent}
        staging.buffers_to_host()
        for name in buffers:
            sent[name] = staging.host[name].numpy().copy()
            out[name] = staging.host[name].numpy()
            hyper[name] = self.hyper
        start = time.perf_counter()
        with torch.no_grad():
            try:
                client.push_pull_into(sent, out, hyper)
            except RuntimeError:
                if not recover():
                    raise
                if self.mode != "bsp":
                    client.end_step()
                    self.start_round(staging.arrays(names))
                    return time.perf_counter() - start
                client.push_pull_into(sent, out, hyper)
            client.end_step()
            self.after(sent, {n: out[n] for n in names})
        staging.to_model()
        return time.perf_counter() - start

    def after(self, sent, answer):
        """The worker's weights after the exchange, written into `answer`
        ({name: the servers' weights}, float32 arrays): diloco takes them
        as they are; easgd moves the local weights `sent` toward them by
        alpha / (1 - alpha) of the difference."""
        if self.outer == "easgd":
            share = np.float32(self.alpha / (1.0 - self.alpha))
            for n, a in answer.items():
                x = sent[n]
                a[...] = x - share * (x - a)
        self.start_round(answer)


def dynamic_round_steps(local_steps, mine, fastest):
    """Dynamic local updates (Liu et al. 2024): `local_steps` scaled by
    this worker's rate over the fastest worker's, rounded, in [1,
    local_steps]; local_steps while either rate is unknown (<= 0)."""
    if not mine > 0 or not fastest > 0:
        return local_steps
    return int(min(local_steps, max(1, round(local_steps * mine / fastest))))


def local_weights(params):
    """{name: float32 CPU array} of the parameters' current values (a new
    copy where the parameter is not a contiguous float32 CPU tensor)."""
    out = {}
    with torch.no_grad():
        for name, p in params.items():
            t = p.detach()
            if t.dtype != torch.float32 or t.device.type != "cpu":
                t = t.to("cpu", torch.float32)
            out[name] = t.contiguous().numpy()
    return out
