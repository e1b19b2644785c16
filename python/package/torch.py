"""PyTorch through asyncps: an ordinary training loop becomes a worker by
wrapping its optimizer, as with Horovod.

    import asyncps, asyncps.torch
    client = asyncps.Client(servers, rank=rank, num_workers=2, mode="async")
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    opt = asyncps.torch.DistributedOptimizer(
        opt, client, named_parameters=model.named_parameters())
    for x, y in loader:
        opt.zero_grad()          # or model.zero_grad(): clears gradients
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()               # pushes the gradients as they are now;
                                 # the servers' new weights are in the model

The servers hold the weights and apply the wrapped optimizer's update (the
same arithmetic as torch.optim.SGD, Adam, AdamW and Adagrad), with each
param group's hyper-parameters as they are at that step() (so LR
schedulers and per-group settings work); its state (momentum buffers, Adam's
moments) lives on the servers. step() is one fused push-pull for every
parameter that has a gradient; a parameter whose .grad is None is skipped,
as PyTorch skips it. Gradients accumulate over several backward() calls and
can be clipped or scaled before step(), as in plain PyTorch.

A shard that restarts from a checkpoint is waited for; one that restarts
without one gets the model back from this worker's parameters (the step in
flight is lost where it was not applied, and in bsp is pushed again). The
first worker to build the optimizer declares the model, so its
initialisation is everyone's: the others start from the servers' weights.

Parameters may be float32, bfloat16 or float16, on the CPU or a CUDA
device: the gradients cross through a float32 host copy (pinned for a GPU:
one copy each way per step), the wire carries the parameter's own dtype
(a bfloat16 parameter's gradient and weights travel as bfloat16), and the
servers keep float32 master weights.

state_dict() reads the optimizer state back from the servers in the
wrapped class's format; load_state_dict() sends one there.

With named_buffers=model.named_buffers() (sync_buffers=True), BatchNorm's
running statistics are kept on the servers too, averaged over the workers.
"""

import concurrent.futures
import contextlib
import time

import numpy as np
import torch

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_WIRE = {torch.bfloat16: "bf16", torch.float16: "f16"}

SUPPORTED = "torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW, " \
    "torch.optim.Adagrad"


def _kind(optimizer):
    """The servers' optimizer kind for a torch.optim instance, or
    ValueError naming what is supported."""
    groups = optimizer.param_groups
    for group in groups:
        if group.get("maximize") or group.get("amsgrad"):
            raise ValueError(
                "asyncps.torch.DistributedOptimizer: maximize and amsgrad "
                "are not supported")
    if isinstance(optimizer, torch.optim.SGD):
        return ("momentum" if any(g["momentum"] != 0 for g in groups)
                else "sgd")
    if isinstance(optimizer, torch.optim.AdamW):
        return "adamw"
    if isinstance(optimizer, torch.optim.Adam):
        return "adam"
    if isinstance(optimizer, torch.optim.Adagrad):
        return "adagrad"
    raise ValueError(
        f"asyncps.torch.DistributedOptimizer wraps {SUPPORTED}; not "
        f"{type(optimizer).__module__}.{type(optimizer).__name__}")


def _hyper(kind, group):
    """One param group's hyper-parameters, as the servers name them."""
    h = {"lr": float(group["lr"]),
         "weight_decay": float(group.get("weight_decay", 0.0))}
    if kind == "momentum":
        momentum = float(group["momentum"])
        h.update(momentum=momentum, nesterov=bool(group["nesterov"]),
                 # Without momentum PyTorch keeps no buffer: v = g each time.
                 dampening=float(group["dampening"]) if momentum else 0.0)
    elif kind in ("adam", "adamw"):
        beta1, beta2 = group["betas"]
        h.update(beta1=float(beta1), beta2=float(beta2),
                 eps=float(group["eps"]))
    elif kind == "adagrad":
        h.update(eps=float(group["eps"]), lr_decay=float(group["lr_decay"]),
                 initial_accumulator_value=float(
                     group["initial_accumulator_value"]))
    return h


def _from_module(model, kind, lr, hyper):
    """The first API's form, DistributedOptimizer(model, client,
    kind="sgd", lr=...): the torch.optim optimizer it meant."""
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no parameter to train")
    wd = hyper.get("weight_decay", 0.0)
    if kind in ("sgd", "momentum"):
        return torch.optim.SGD(
            params, lr=lr, weight_decay=wd,
            momentum=hyper.get("momentum", 0.9) if kind == "momentum" else 0,
            nesterov=hyper.get("nesterov", False))
    if kind == "adam":
        return torch.optim.Adam(
            params, lr=lr, weight_decay=wd, eps=hyper.get("eps", 1e-8),
            betas=(hyper.get("beta1", 0.9), hyper.get("beta2", 0.999)))
    if kind == "adagrad":
        return torch.optim.Adagrad(params, lr=lr, weight_decay=wd,
                                   eps=hyper.get("eps", 1e-10))
    raise ValueError(f"optimizer '{kind}' (want sgd, momentum, adam, adagrad)")


def load_state_dict(model, servers, strict=True):
    """Fills `model`'s parameters (named as its named_parameters(), as
    DistributedOptimizer declares them) with the weights the servers hold
    now; `servers` is "host:port,..." or a list. With `strict`, a parameter
    the servers do not hold is a KeyError naming it."""
    import asyncps
    reader = asyncps.Client(servers, reader=True)
    try:
        reader.attach()
        held = reader.tensors
        missing = [n for n, _ in model.named_parameters() if n not in held]
        if strict and missing:
            raise KeyError(f"the servers hold no tensor {missing}")
        # Floating-point buffers too, where the servers keep them.
        tensors = dict(model.named_parameters())
        tensors.update((n, b) for n, b in model.named_buffers()
                       if b.is_floating_point())
        weights = reader.pull([n for n in tensors if n in held])
    finally:
        reader.leave()
    with torch.no_grad():
        for name, t in tensors.items():
            if name in weights:
                t.copy_(torch.from_numpy(weights[name]).reshape(t.shape))
    return model


class DistributedOptimizer(torch.optim.Optimizer):
    """A torch.optim optimizer whose updates the asyncps servers apply.

    Usable wherever a torch.optim.Optimizer is: param_groups is the wrapped
    optimizer's own list (schedulers and code that edit it reach the
    servers at the next step()), zero_grad() clears gradients only.
    """

    def __init__(self, optimizer, client, named_parameters=None,
                 overlap=False, named_buffers=None, sync_buffers=True,
                 **legacy):
        """Wraps `optimizer` (see the module's doc). `overlap=True` pushes
        each gradient as backward produces it, on a background thread, and
        step() then only waits for them and pulls: faster where the network
        is slow, but a gradient changed after backward (clipping, scaling,
        a second backward() accumulating into it) cannot be sent again, so
        step() refuses it with an error naming the parameter.
        `named_buffers` (model.named_buffers()): with `sync_buffers`, the
        floating-point buffers (BatchNorm's running statistics) are kept on
        the servers too, averaged over the workers that push them (each
        step() sends them and takes the average back), so a model pulled
        or exported from the servers evaluates as trained."""
        if isinstance(optimizer, torch.nn.Module):
            # The first API: DistributedOptimizer(model, client, lr=...,
            # kind="momentum", momentum=...).
            module = optimizer
            optimizer = _from_module(module, legacy.pop("kind", "sgd"),
                                     legacy.pop("lr", 0.01), legacy)
            named_parameters = module.named_parameters()
            named_buffers = module.named_buffers()
        elif legacy:
            raise TypeError(f"unexpected arguments {sorted(legacy)}")
        self._kind = _kind(optimizer)
        self._opt = optimizer
        self._client = client
        # The wrapped optimizer's own objects: edits through either reach
        # both (a scheduler sets lr in these dicts).
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._step_count = 0
        by_id = {}
        if named_parameters is not None:
            by_id = {id(p): name for name, p in named_parameters}
        self._names = {}  # id(param) -> name
        self._params = {}  # name -> param
        # name -> float32 CPU tensor the client reads and writes: the
        # parameter itself, or a staging copy (_grad_host has its gradient's).
        self._host = {}
        self._grad_host = {}
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                name = by_id.get(id(p), f"group{g}.param{i}")
                if name in self._params:
                    raise ValueError(f"parameter '{name}' appears twice")
                if p.dtype not in _DTYPES or p.device.type not in ("cpu",
                                                                   "cuda"):
                    raise ValueError(
                        f"parameter '{name}': asyncps trains float32, "
                        f"bfloat16 and float16 tensors on the CPU or a CUDA "
                        f"device, not {p.dtype} on {p.device}")
                self._names[id(p)] = name
                self._params[name] = p
                if (p.dtype == torch.float32 and p.device.type == "cpu"
                        and p.is_contiguous()):
                    self._host[name] = p.detach()  # The parameter itself.
                else:
                    # An f32 master copy in host memory (pinned for a GPU:
                    # one copy each way per step), as the servers keep.
                    pin = p.device.type == "cuda"
                    self._host[name] = torch.empty(
                        p.shape, dtype=torch.float32, pin_memory=pin)
                    self._host[name].copy_(p.detach())
                    self._grad_host[name] = torch.empty(
                        p.shape, dtype=torch.float32, pin_memory=pin)
        if not self._params:
            raise ValueError("the model has no parameter to train")
        # Buffers: name -> tensor (floating point only: BatchNorm's
        # num_batches_tracked stays local).
        self._buffers = {}
        if sync_buffers and named_buffers is not None:
            for name, b in named_buffers:
                if not b.is_floating_point():
                    continue
                if name in self._params:
                    raise ValueError(f"buffer '{name}' is named as a parameter")
                self._buffers[name] = b
                if (b.dtype == torch.float32 and b.device.type == "cpu"
                        and b.is_contiguous()):
                    self._host[name] = b  # Updated in place by the model.
                else:
                    self._host[name] = b.detach().to("cpu", torch.float32)
        first = _hyper(self._kind, self.param_groups[0])
        self._buffer_hyper = first
        # A bf16/f16 parameter travels in its own dtype (half the bytes of
        # f32, and nothing lost: the parameter holds no more than that).
        wire = {n: _WIRE[p.dtype] for n, p in self._params.items()
                if p.dtype in _WIRE}
        client.declare(self._arrays(), optimizer=self._kind,
                       buffers=list(self._buffers), wire_dtypes=wire, **first)
        self.pull()  # Everyone starts from the servers' weights.
        self._synchronized = False
        self._skip = False
        self._overlap = overlap
        self._sent = {}  # overlap: name -> the gradient pushed this step.
        self._pending = []  # overlap: the pushes in flight.
        self._twice = []  # overlap: names a second backward reached.
        self._hooks = []
        if overlap:
            self._sender = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="asyncps-push")
            # Where each parameter's new weights land during backward.
            self._prefetched = {n: torch.empty(p.shape, dtype=torch.float32)
                                for n, p in self._params.items()}
            for name, p in self._params.items():
                self._hooks.append(p.register_hook(self._pusher(name)))
        # Progress for the heartbeats (report()).
        self._samples = 0
        self._exchange_seconds = 0.0
        # Seconds step() spent outside the client's calls (the wrapper's
        # own cost: gathering gradients, hyper-parameters, copies).
        self.wrapper_seconds = 0.0
        self._rate = (time.perf_counter(), 0)  # Since when, samples then.
        self._samples_per_second = 0.0
        self._loss = 0.0

    @property
    def client(self):
        return self._client

    @property
    def exchange_seconds(self):
        """Seconds step() spent in the client's calls (the network and the
        servers), so far."""
        return self._exchange_seconds

    @property
    def optimizer(self):
        """The wrapped torch.optim optimizer (its step() is never called)."""
        return self._opt

    def _arrays(self, names=None):
        return {n: self._host[n].numpy()
                for n in (self._host if names is None else names)}

    def _staged_buffers(self):
        return [n for n, b in self._buffers.items() if self._host[n] is not b]

    def _buffers_to_host(self):
        """The model's current buffer values where they are staged."""
        with torch.no_grad():
            for n in self._staged_buffers():
                self._host[n].copy_(self._buffers[n])

    def _to_params(self):
        """Staged weights (GPU, bf16/f16 parameters, and buffers) into the
        model."""
        cuda = False
        with torch.no_grad():
            for n in self._grad_host:
                p = self._params[n]
                p.copy_(self._host[n], non_blocking=p.is_cuda)
                cuda |= p.is_cuda
            for n in self._staged_buffers():
                b = self._buffers[n]
                b.copy_(self._host[n], non_blocking=b.is_cuda)
                cuda |= b.is_cuda
        if cuda:
            torch.cuda.synchronize()

    def _recover(self):
        """After a call failed: if a shard lost the model (it restarted
        without a checkpoint), hands it the parameters and pulls every
        weight afresh into them. False if that was not the failure."""
        with torch.no_grad():
            recovered = self._client.recover(self._arrays())
        if recovered:
            self._to_params()
        return recovered

    def pull(self):
        """The servers' weights into the model's parameters."""
        with torch.no_grad():
            try:
                self._client.pull_into(self._arrays())
            except RuntimeError:
                if not self._recover():
                    raise
        self._to_params()

    def zero_grad(self, set_to_none=None):
        """Clears the gradients, as the wrapped optimizer does (nothing
        else: model.zero_grad() is the same)."""
        if set_to_none is None:
            self._opt.zero_grad()
        else:
            self._opt.zero_grad(set_to_none=set_to_none)

    def _pusher(self, name):
        """overlap: the hook that sends `name`'s gradient during backward
        and prefetches its new weights (push-pull on a background thread,
        into a staging copy: backward may still read the parameter)."""
        p = self._params[name]
        group = next(g for g in self.param_groups
                     if any(q is p for q in g["params"]))

        def hook(grad):
            if name in self._sent:
                self._twice.append(name)
                return grad
            g = grad.detach().to("cpu", torch.float32).contiguous().clone()
            self._sent[name] = g
            h = {name: _hyper(self._kind, group)}
            self._pending.append(self._sender.submit(
                self._client.push_pull_into, {name: g.numpy()},
                {name: self._prefetched[name].numpy()}, h))
            return grad
        return hook

    def _finish_overlapped(self):
        """overlap: waits for the push-pulls, checks that no gradient
        changed after it left, and takes the prefetched weights (and pulls
        those of parameters without a gradient, and the buffers)."""
        failure = None
        if self._client.mode == "bsp":
            # Before waiting: the other ranks' steps may wait for this.
            try:
                self._client.push_no_gradient(
                    [n for n in self._params if n not in self._sent])
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
            p = self._params[name]
            if p.grad is None or not torch.equal(
                    p.grad.detach().to("cpu", torch.float32), g):
                raise RuntimeError(
                    f"asyncps overlap: the gradient of '{name}' changed "
                    "after it was pushed (clipping or scaling after "
                    "backward?): use overlap=False")
        start = time.perf_counter()
        ended = False
        with torch.no_grad():
            if failure is not None:
                # A shard lost the model: everything afresh (the step in
                # flight is lost where it was not applied).
                if not self._recover():
                    raise failure
            else:
                for name in sent:
                    self._host[name].copy_(self._prefetched[name])
                rest = [n for n in self._params if n not in sent]
                try:
                    if self._buffers:
                        self._buffers_to_host()
                        self._client.push(
                            {n: self._host[n].numpy().copy()
                             for n in self._buffers},
                            {n: self._buffer_hyper for n in self._buffers})
                        rest += list(self._buffers)
                    # bsp: the parameters without a gradient count as zero
                    # from this rank (end_step), then their step is pulled.
                    self._client.end_step()
                    ended = True
                    if rest:  # Other workers may have moved them.
                        self._client.pull_into(self._arrays(rest))
                except RuntimeError:
                    if not self._recover():
                        raise
        self._to_params()
        if not ended:
            self._client.end_step()
        self._exchange_seconds += time.perf_counter() - start
        self._send_progress()

    def _exchange(self):
        """Pushes every gradient as it is now, with its group's
        hyper-parameters, and writes the new weights into the parameters."""
        if self._overlap:
            self._finish_overlapped()
            return
        entered = time.perf_counter()
        grads, out, hyper = {}, {}, {}
        cuda = False
        for group in self.param_groups:
            h = _hyper(self._kind, group)
            for p in group["params"]:
                if p.grad is None:
                    # As PyTorch: no gradient, no update. In bsp the step
                    # counts it as zero from this rank (below).
                    continue
                if p.grad.is_sparse:
                    raise ValueError(
                        f"parameter '{self._names[id(p)]}': sparse gradients "
                        "are not supported")
                name = self._names[id(p)]
                if name in self._grad_host:
                    staged = self._grad_host[name]
                    staged.copy_(p.grad.detach(), non_blocking=p.is_cuda)
                    cuda |= p.is_cuda
                    grads[name] = staged.numpy()
                else:
                    grads[name] = p.grad.detach().contiguous().numpy()
                out[name] = self._host[name].numpy()
                hyper[name] = h
        if not grads and self._client.mode != "bsp":
            return
        self._buffers_to_host()
        for name in self._buffers:  # Their values, to be averaged in.
            grads[name] = out[name] = self._host[name].numpy()
            hyper[name] = self._buffer_hyper
        if cuda:
            torch.cuda.synchronize()  # The gradients' copies have landed.
        missing = [n for n in self._params if n not in grads]
        rest = self._arrays(missing)
        grads = {n: g.copy() if n in self._buffers else g
                 for n, g in grads.items()}  # Sent before `out` is written.
        start = time.perf_counter()
        with torch.no_grad():
            try:
                # bsp: said before waiting for the step, whose other ranks
                # may wait for this (docs/MODES.md "A partial step").
                self._client.push_no_gradient(missing)
                if grads:
                    self._client.push_pull_into(grads, out, hyper)
            except RuntimeError:
                if not self._recover():
                    raise
                if self._client.mode == "bsp":
                    # The step is applied once every gradient reached every
                    # slice: all of it again (a slice that has it drops it).
                    self._client.push_pull_into(grads, out, hyper)
            # In bsp the pull after end_step waits for the step of the
            # parameters without a gradient here: every rank holds the same
            # weights.
            self._client.end_step()
            if rest:  # Other workers may have moved them.
                self._client.pull_into(rest)
        network = time.perf_counter() - start
        self._to_params()
        self._exchange_seconds += network
        self._send_progress()
        # This wrapper's own cost: step() less the client's calls.
        self.wrapper_seconds += time.perf_counter() - entered - network

    def report(self, loss=None, samples=0):
        """Tells the servers of this step (its loss, the examples it
        trained on): psctl status and /metrics show Python workers as they
        show ps_worker. A step(closure) reports the closure's loss."""
        if loss is not None:
            self._loss = float(loss)
        self._samples += int(samples)
        now = time.perf_counter()
        since, then = self._rate
        if now - since >= 1.0:
            self._samples_per_second = (self._samples - then) / (now - since)
            self._rate = (now, self._samples)
        self._send_progress()

    def _send_progress(self):
        self._client.report(samples=self._samples,
                            samples_per_second=self._samples_per_second,
                            loss=self._loss,
                            exchange_seconds=self._exchange_seconds)

    def synchronize(self):
        """Sends the gradients now (Horovod's meaning: a step() inside
        skip_synchronize() then sends nothing more)."""
        self._exchange()
        self._synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self):
        """For scripts written for Horovod: synchronize(), change nothing
        the servers need, then step() inside this block."""
        self._skip = True
        try:
            yield
        finally:
            self._skip = False

    def step(self, closure=None):
        """Pushes the gradients as they are and leaves the servers' new
        weights in the parameters (one round trip per shard)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if loss is not None:
            self._loss = float(loss)
        if not (self._skip and self._synchronized):
            self._exchange()
        self._synchronized = False
        return loss

    def add_param_group(self, param_group):
        raise NotImplementedError(
            "asyncps: the model's parameters are declared once; add groups "
            "to the wrapped optimizer before wrapping it")

    def _ordered(self):
        """Names in state_dict's index order (groups, then params)."""
        return [self._names[id(p)] for g in self.param_groups
                for p in g["params"]]

    def state_dict(self):
        """The wrapped class's own format, its per-parameter state read
        from the servers: a plain torch.optim optimizer of that class can
        load_state_dict it and go on."""
        saved = self._opt.state_dict()
        names = self._ordered()
        held = self._client.pull_state(names)
        state = {}
        for index, name in enumerate(names):
            s = held[name]
            t = {k: torch.from_numpy(s[k]) for k in ("slot1", "slot2")
                 if s[k] is not None}
            steps = int(s["steps"])
            if self._kind == "adagrad":
                state[index] = {"step": torch.tensor(float(steps)),
                                "sum": t["slot1"]}
            elif steps == 0:
                continue  # PyTorch keeps no state before a first update.
            elif self._kind == "sgd":
                state[index] = {"momentum_buffer": None}
            elif self._kind == "momentum":
                state[index] = {"momentum_buffer": t["slot1"]}
            else:
                state[index] = {"step": torch.tensor(float(steps)),
                                "exp_avg": t["slot1"],
                                "exp_avg_sq": t["slot2"]}
        saved["state"] = state
        return saved

    def load_state_dict(self, state_dict):
        """Takes the param groups' hyper-parameters (they reach the servers
        at the next step) and sends the per-parameter state to the servers;
        the weights stay theirs."""
        groups = state_dict["param_groups"]
        self._opt.load_state_dict({"state": {}, "param_groups": groups})
        names = self._ordered()
        order = [i for g in groups for i in g["params"]]
        if len(order) != len(names):
            raise ValueError(
                f"the state_dict has {len(order)} parameters; this optimizer "
                f"has {len(names)}")

        def host(t):
            return t.detach().to("cpu", torch.float32).contiguous().numpy()

        send = {}
        for index, name in zip(order, names):
            s = state_dict["state"].get(index)
            if s is None:
                continue
            if self._kind == "momentum":
                if s.get("momentum_buffer") is None:
                    continue
                send[name] = {"slot1": host(s["momentum_buffer"]),
                              "steps": 1}
            elif self._kind in ("adam", "adamw"):
                send[name] = {"slot1": host(s["exp_avg"]),
                              "slot2": host(s["exp_avg_sq"]),
                              "steps": int(float(s["step"]))}
            elif self._kind == "adagrad":
                send[name] = {"slot1": host(s["sum"]),
                              "steps": int(float(s["step"]))}
        if send:
            self._client.load_state(send)

    def close(self):
        """Leaves the job (and, with overlap, removes the hooks)."""
        for h in self._hooks:
            h.remove()
        if self._overlap:
            self._sender.shutdown(wait=True)
        self._client.leave()


class _Rows(torch.autograd.Function):
    """The rows of `ids` pulled from the servers; backward pushes their
    gradient (only the rows the batch touched) to the servers."""

    @staticmethod
    def forward(ctx, ids, anchor, table):
        flat = ids.detach().reshape(-1).to("cpu", torch.int64).numpy()
        rows = table._take_prefetched(flat)
        if rows is None:
            rows = table.client.pull_rows(table.name, flat)
        ctx.table, ctx.flat = table, flat
        return torch.from_numpy(rows).view(
            *ids.shape, table.embedding_dim).to(anchor.device)

    @staticmethod
    def backward(ctx, grad):
        table = ctx.table
        g = grad.detach().reshape(-1, table.embedding_dim).to(
            "cpu", torch.float32).contiguous().numpy()
        if table._next is None:
            table.client.push_rows(table.name, ctx.flat, g)
        else:  # The next batch's rows come back with this push.
            table._prefetched = (table._next, table.client.push_pull_rows(
                table.name, ctx.flat, g, table._next))
            table._next = None
        return None, None, None


class Embedding(torch.nn.Module):
    """A sparse embedding table kept on the asyncps servers
    (docs/SPARSE.md): forward pulls the rows of the batch's ids, backward
    pushes their gradient, so only the rows a batch touches travel. The
    servers apply the table's own optimizer to those rows (adagrad, sgd,
    adam: lazy, per-row steps), so the module has no parameters: the dense
    part of the model trains through DistributedOptimizer (or any
    optimizer), this part trains as backward() runs.

        emb = asyncps.torch.Embedding(None, 32, client=client, name="user",
                                      optimizer="adagrad", lr=0.05)

    num_embeddings None: an unbounded table (any int64 id: hashed
    features). The first worker to declare the table makes it (rows start
    N(0, init_stddev^2), a function of the seed and the id); the others must
    declare it alike. Rows cross as float32 CPU arrays; the output is on
    the ids' device. The job's mode covers the rows (bsp: each step's mean
    over the workers, forward's pull waiting for the step before; each
    worker must run forward and backward every step).
    """

    def __init__(self, num_embeddings, embedding_dim, client, name,
                 optimizer="adagrad", lr=0.01, init_stddev=0.01, seed=0,
                 **hyper):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.embedding_dim = embedding_dim
        self.client = client
        self.name = name
        client.declare_embedding(name, embedding_dim, num_rows=num_embeddings,
                                 optimizer=optimizer, lr=lr,
                                 init_stddev=init_stddev, seed=seed, **hyper)
        # Autograd calls backward only for an output that needs a gradient:
        # an empty tensor that does (not a Parameter: no optimizer sees it).
        self._anchor = torch.empty(0, requires_grad=True)
        self._next = None         # prefetch(): ids the next push fetches.
        self._prefetched = None   # (ids, rows) that push fetched.

    def prefetch(self, ids):
        """Says which ids the next forward will look up (e.g. the next
        batch's), so the next backward's push brings their rows back in the
        same round trip (push_pull_rows) instead of forward pulling them.
        The rows are read just after this push is applied, so in async
        training they may miss other workers' pushes that land between that
        and the next forward (as a pull at any moment may). A forward with
        other ids pulls as usual."""
        self._next = torch.as_tensor(ids).reshape(-1).to(
            "cpu", torch.int64).numpy().copy()

    def _take_prefetched(self, flat):
        """The prefetched rows if `flat` is what was prefetched, else None."""
        got, self._prefetched = self._prefetched, None
        if got is not None and np.array_equal(got[0], flat):
            return got[1]
        return None

    def forward(self, ids):
        anchor = self._anchor if self._anchor.device == ids.device else \
            self._anchor.detach().to(ids.device).requires_grad_()
        return _Rows.apply(ids, anchor, self)

    def rows(self, ids):
        """The current rows of `ids` (no gradient), e.g. to export."""
        flat = torch.as_tensor(ids).reshape(-1).to("cpu", torch.int64)
        return torch.from_numpy(self.client.pull_rows(self.name,
                                                      flat.numpy()))


class EmbeddingBag(Embedding):
    """Embedding with the rows of each bag pooled ("sum" or "mean"), as
    torch.nn.EmbeddingBag on 2-D ids (batch, bag): forward pulls the rows
    once, backward pushes each row's share of the pooled gradient."""

    def __init__(self, num_embeddings, embedding_dim, client, name,
                 mode="mean", **kwargs):
        if mode not in ("sum", "mean"):
            raise ValueError(f"EmbeddingBag mode {mode!r}: want sum or mean")
        super().__init__(num_embeddings, embedding_dim, client, name,
                         **kwargs)
        self.mode = mode

    def forward(self, ids):
        if ids.dim() != 2:
            raise ValueError("EmbeddingBag: want ids of shape (batch, bag)")
        rows = super().forward(ids)
        return rows.sum(1) if self.mode == "sum" else rows.mean(1)
