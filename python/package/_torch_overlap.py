"""DistributedOptimizer(overlap=True)'s pushes during backward: a hook on
each parameter sends its gradient as backward produces it and prefetches
its new weights, and step() collects them.
"""

import concurrent.futures
import time

import torch

from asyncps import _torch_kinds as kinds


class Overlap:
    """The gradients of one step in flight, on one background thread.

    Used from the training thread only (the hooks run there, inside
    backward); the background thread runs the client's push_pull_into alone.
    """

    def __init__(self, client, kind, params, param_groups):
        """Hooks every parameter of `params` (name -> parameter), each
        pushed with the hyper-parameters of its group in `param_groups` as
        they are when backward reaches it."""
        self._client = client
        self._sent = {}  # name -> the gradient pushed this step.
        self._pending = []  # The pushes in flight.
        self._twice = []  # Names a second backward reached.
        self._sender = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="asyncps-push")
        # Where each parameter's new weights land during backward.
        self.prefetched = {n: torch.empty(p.shape, dtype=torch.float32)
                           for n, p in params.items()}
        self._hooks = []
        for name, p in params.items():
            group = next(g for g in param_groups
                         if any(q is p for q in g["params"]))
            self._hooks.append(p.register_hook(self._pusher(kind, name,
                                                            group)))

    def _pusher(self, kind, name, group):
        """The hook that sends `name`'s gradient during backward and
        prefetches its new weights (push-pull on the background thread, into
        a staging copy: backward may still read the parameter)."""

        def hook(grad):
            if name in self._sent:
                self._twice.append(name)
                return grad
            g = grad.detach().to("cpu", torch.float32).contiguous().clone()
            self._sent[name] = g
            h = {name: kinds.hyper(kind, group)}
            self._pending.append(self._sender.submit(
                self._client.push_pull_into, {name: g.numpy()},
                {name: self.prefetched[name].numpy()}, h))
            return grad
        return hook

    def collect(self, params):
        """Waits for this step's push-pulls (in bsp, first says which of
        `params` got no gradient) and starts the next step. Returns (the
        gradients pushed, by name; the first RuntimeError of a call, or
        None). RuntimeError if a gradient got a second backward or changed
        after it was pushed: the servers did not get what step() means."""
        failure = None
        if self._client.mode == "bsp":
            # Before waiting: the other ranks' steps may wait for this.
            try:
                self._client.push_no_gradient(
                    [n for n in params if n not in self._sent])
            except RuntimeError as e:
                failure = e
        for f in self._pending:
            try:
                f.result()
            except RuntimeError as e:
                failure = failure or e
        sent, twice = self._sent, self._twice
        self._pending, self._sent, self._twice = [], {}, []
        if twice:
            raise RuntimeError(
                f"asyncps overlap: parameter '{twice[0]}' got a second "
                "backward() after its gradient was pushed (gradient "
                "accumulation): use overlap=False")
        for name, g in sent.items():
            p = params[name]
            if p.grad is None or not torch.equal(
                    p.grad.detach().to("cpu", torch.float32), g):
                raise RuntimeError(
                    f"asyncps overlap: the gradient of '{name}' changed "
                    "after it was pushed (clipping or scaling after "
                    "backward?): use overlap=False")
        return sent, failure

    def finish(self, staging, params, buffers, buffer_hyper, recover):
        """step(): waits for the push-pulls, checks that no gradient changed
        after it left, and takes the prefetched weights into `staging` (the
        optimizer's HostTensors) and the model; pulls those of `params`
        without a gradient, and pushes and pulls `buffers` (with
        `buffer_hyper`). On a failed call, `recover()` (the optimizer's
        _recover) says whether a shard that lost the model got it back (the
        step in flight is lost where it was not applied). Returns the
        seconds spent in the client's calls."""
        sent, failure = self.collect(params)
        host = staging.host
        start = time.perf_counter()
        ended = False
        with torch.no_grad():
            if failure is not None:
                if not recover():
                    raise failure
            else:
                for name in sent:
                    host[name].copy_(self.prefetched[name])
                rest = [n for n in params if n not in sent]
                try:
                    if buffers:
                        staging.buffers_to_host()
                        self._client.push(
                            {n: host[n].numpy().copy() for n in buffers},
                            {n: buffer_hyper for n in buffers})
                        rest += list(buffers)
                    # bsp: the parameters without a gradient count as zero
                    # from this rank (end_step), then their step is pulled.
                    self._client.end_step()
                    ended = True
                    if rest:  # Other workers may have moved them.
                        self._client.pull_into(staging.arrays(rest))
                except RuntimeError:
                    if not recover():
                        raise
        staging.to_model()
        if not ended:
            self._client.end_step()
        return time.perf_counter() - start

    def close(self):
        """Removes the hooks and waits for the background thread."""
        for h in self._hooks:
            h.remove()
        self._sender.shutdown(wait=True)
