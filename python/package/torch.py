"""PyTorch through asyncps: an ordinary training loop becomes a worker.

    import asyncps, asyncps.torch
    client = asyncps.Client(servers, rank=rank, num_workers=2, mode="bsp")
    opt = asyncps.torch.DistributedOptimizer(model, client, optimizer="momentum",
                                             lr=0.05, momentum=0.9)
    for x, y in batches:
        opt.zero_grad()        # the servers' current weights into the model
        loss = F.cross_entropy(model(x), y)
        loss.backward()        # each gradient leaves as autograd produces it
        opt.step()             # waits for the pushes, ends the step

The servers hold the weights and apply the optimizer (its state lives there
too); the model's parameters are this worker's copy, written in place by
each pull. A shard that restarts from a checkpoint is waited for; one that
restarts without one gets the model back from this copy (the first worker
to notice hands it over; the step in flight is lost where it was not
applied, and in bsp is pushed again). The first worker to build the optimizer declares the model, so
its initialisation is everyone's (seed the others alike, or not: theirs is
not used).
"""

import concurrent.futures

import torch


class DistributedOptimizer:
    """Pulls weights before a step and pushes each parameter's gradient as
    autograd produces it, through an asyncps.Client."""

    def __init__(self, model, client, optimizer="sgd", lr=0.01, **hyper):
        """Declares `model`'s parameters (float32, on the CPU) as the model,
        with `optimizer` ("sgd", "momentum", "adam", "adagrad") and its
        hyper-parameters (momentum, nesterov, beta1, beta2, eps,
        weight_decay) applied on the servers."""
        self._client = client
        self._params = {}
        for name, p in model.named_parameters():
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32 or p.device.type != "cpu":
                raise ValueError(
                    f"parameter '{name}': asyncps trains float32 CPU tensors, "
                    f"not {p.dtype} on {p.device}")
            if not p.is_contiguous():
                raise ValueError(f"parameter '{name}' is not contiguous")
            self._params[name] = p
        if not self._params:
            raise ValueError("the model has no parameter to train")
        client.declare(
            {name: p.detach().numpy() for name, p in self._params.items()},
            optimizer=optimizer, lr=lr, **hyper)
        # One thread sends the pushes in order, while backward goes on.
        self._sender = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="asyncps-push")
        self._pending = []
        self._grads = {}  # This step's gradients, by name.
        self._hooks = [p.register_hook(self._pusher(name))
                       for name, p in self._params.items()]

    def _pusher(self, name):
        def hook(grad):
            g = grad.detach().contiguous()  # Kept alive until the step ends.
            self._grads[name] = g
            self._pending.append(self._sender.submit(
                lambda: self._client.push({name: g.numpy()})))
            return grad
        return hook

    @property
    def client(self):
        return self._client

    def _arrays(self):
        return {name: p.detach().numpy() for name, p in self._params.items()}

    def _recover(self):
        """After a call failed: if a shard lost the model (it restarted
        without a checkpoint), hands it the parameters and pulls every
        weight afresh into them. False if that was not the failure."""
        with torch.no_grad():
            return self._client.recover(self._arrays())

    def pull(self):
        """The servers' weights into the model's parameters (in bsp, those
        after every worker's previous step)."""
        with torch.no_grad():
            try:
                self._client.pull_into(self._arrays())
            except RuntimeError:
                if not self._recover():
                    raise

    def zero_grad(self, set_to_none=True):
        """Clears the local gradients and pulls the current weights."""
        for p in self._params.values():
            p.grad = None
        self.pull()

    def step(self, closure=None):
        """Waits for this step's pushes (raising a push's error), pushes
        zeros for parameters that got no gradient (so bsp's step completes),
        and ends the step."""
        loss = closure() if closure is not None else None
        missing = [n for n in self._params if n not in self._grads]
        if missing:
            zeros = {n: torch.zeros_like(self._params[n]) for n in missing}
            self._grads.update(zeros)
            arrays = {n: z.numpy() for n, z in zeros.items()}
            self._pending.append(
                self._sender.submit(lambda: self._client.push(arrays)))
        failure = None
        try:
            for f in self._pending:
                try:
                    f.result()
                except RuntimeError as e:
                    failure = failure or e
            if failure is not None:
                if not self._recover():
                    raise failure
                if self._client.mode == "bsp":
                    # The step is applied once every gradient reached every
                    # slice: all of it again (a slice that has it drops it).
                    self._client.push(
                        {n: g.numpy() for n, g in self._grads.items()})
        finally:
            self._pending.clear()
            self._grads.clear()
        self._client.end_step()
        return loss

    def close(self):
        """Removes the hooks, stops the sender and leaves the job."""
        for h in self._hooks:
            h.remove()
        self._sender.shutdown(wait=True)
        self._client.leave()
