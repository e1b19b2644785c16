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

Embedding and EmbeddingBag are sparse tables on the servers whose rows train
as backward() runs (docs/SPARSE.md).

With outer="diloco" or "easgd" (and local_steps=H) the wrapped optimizer
runs here instead, and every H-th step() exchanges with the servers, which
apply an outer optimizer (docs/MODES.md "Outer optimizers").
"""

import contextlib
import time

import torch

from asyncps import _torch_kinds as kinds
from asyncps._torch_outer import Outer, local_weights
from asyncps._torch_overlap import Overlap
from asyncps._torch_progress import Progress
from asyncps._torch_staging import HostTensors
# Public here: asyncps.torch.Embedding, .EmbeddingBag, .SUPPORTED.
from asyncps._torch_embedding import Embedding, EmbeddingBag  # noqa: F401
from asyncps._torch_kinds import SUPPORTED  # noqa: F401
# Public here: asyncps.torch.load_state_dict.
from asyncps._torch_load import load_state_dict  # noqa: F401

_WIRE = {torch.bfloat16: "bf16", torch.float16: "f16"}


class DistributedOptimizer(torch.optim.Optimizer):
    """A torch.optim optimizer whose updates the asyncps servers apply.

    Usable wherever a torch.optim.Optimizer is: param_groups is the wrapped
    optimizer's own list (schedulers and code that edit it reach the
    servers at the next step()), zero_grad() clears gradients only.
    """

    def __init__(self, optimizer, client, named_parameters=None,
                 overlap=False, named_buffers=None, sync_buffers=True,
                 outer=None, local_steps=1, outer_lr=0.7, outer_momentum=0.9,
                 alpha=None, dynamic_local_steps=False, **legacy):
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
        or exported from the servers evaluates as trained.

        `outer` ("diloco" or "easgd"; docs/MODES.md "Outer optimizers"):
        the wrapped optimizer runs here, as the inner optimizer, with its
        state kept here; every `local_steps` steps the worker exchanges
        with the servers, which apply the outer optimizer: DiLoCo's outer
        Nesterov step (`outer_lr`, `outer_momentum`; synchronous in bsp,
        with delayed momentum in async and ssp), or EASGD's elastic
        centre (`alpha`, the moving rate; by default 0.9 / num_workers).
        `dynamic_local_steps` (diloco in async): each round takes
        local_steps scaled by this worker's steps a second over the job's
        fastest worker's (as the heartbeats report them), so a slow
        worker's rounds take about as long as a fast one's.

        Raises ValueError for an optimizer or a parameter asyncps does not
        train, a bad outer configuration (naming it), TypeError for an
        unknown keyword argument, and what the client raises if the
        servers refuse the model."""
        optimizer, named_parameters, named_buffers = kinds.current_form(
            optimizer, named_parameters, named_buffers, legacy)
        self._outer = None
        if outer is not None:
            if overlap:
                raise ValueError("overlap=True pushes every step's "
                                 "gradients; with outer= a step pushes none")
            self._outer = Outer(
                outer, client.mode, client.num_workers, local_steps,
                outer_lr, outer_momentum, alpha, dynamic_local_steps,
                lambda: (self._progress.steps_per_second,
                         client.fastest_steps_per_second))
        # With outer=, the wrapped optimizer runs here: any class will do.
        self._kind = (kinds.kind_of(optimizer) if self._outer is None
                      else None)
        self._opt = optimizer
        self._client = client
        # The wrapped optimizer's own objects: edits through either reach
        # both (a scheduler sets lr in these dicts).
        self.defaults = optimizer.defaults
        self.param_groups = optimizer.param_groups
        self.state = optimizer.state
        self._step_count = 0
        self._staging = HostTensors()
        self._name_parameters(named_parameters)
        self._name_buffers(named_buffers if sync_buffers else None)
        self._declare()
        self._synchronized = False  # synchronize() sent this step.
        self._skip = False  # Inside skip_synchronize().
        self._overlapped = (Overlap(client, self._kind, self._params,
                                    self.param_groups) if overlap else None)
        self._progress = Progress(client)  # For the heartbeats.
        # Seconds step() spent outside the client's calls (the wrapper's
        # own cost: gathering gradients, hyper-parameters, copies).
        self.wrapper_seconds = 0.0

    def _name_parameters(self, named_parameters):
        """Names every parameter of the param groups, as `named_parameters`
        does or else "group{g}.param{i}", and stages it. ValueError for a
        name given twice, a parameter asyncps does not train, or none."""
        by_id = {}
        if named_parameters is not None:
            by_id = {id(p): name for name, p in named_parameters}
        self._names = {}  # id(param) -> name
        self._params = {}  # name -> param
        for g, group in enumerate(self.param_groups):
            for i, p in enumerate(group["params"]):
                name = by_id.get(id(p), f"group{g}.param{i}")
                if name in self._params:
                    raise ValueError(f"parameter '{name}' appears twice")
                self._staging.add_parameter(name, p)  # Checks it, too.
                self._names[id(p)] = name
                self._params[name] = p
        if not self._params:
            raise ValueError("the model has no parameter to train")

    def _name_buffers(self, named_buffers):
        """Keeps the floating-point buffers of `named_buffers` (None: none)
        on the servers; BatchNorm's num_batches_tracked stays local.
        ValueError for a buffer named as a parameter."""
        self._buffers = {}  # name -> tensor
        if named_buffers is None:
            return
        for name, b in named_buffers:
            if not b.is_floating_point():
                continue
            if name in self._params:
                raise ValueError(f"buffer '{name}' is named as a parameter")
            self._buffers[name] = b
            self._staging.add_buffer(name, b)

    def _declare(self):
        """Declares the model to the servers, with the first param group's
        hyper-parameters (the first worker to declare it makes it, so its
        initialisation is everyone's), and starts from their weights."""
        if self._outer is not None:
            kind, first = self._outer.kind, self._outer.hyper
        else:
            kind = self._kind
            first = kinds.hyper(self._kind, self.param_groups[0])
        self._buffer_hyper = first
        # A bf16/f16 parameter travels in its own dtype (half the bytes of
        # f32, and nothing lost: the parameter holds no more than that).
        wire = {n: _WIRE[p.dtype] for n, p in self._params.items()
                if p.dtype in _WIRE}
        self._client.declare(self._arrays(), optimizer=kind,
                             buffers=list(self._buffers), wire_dtypes=wire,
                             **first)
        self.pull()  # Everyone starts from the servers' weights.
        if self._outer is not None:
            self._outer.start_round(local_weights(self._params))

    @property
    def client(self):
        return self._client

    @property
    def exchange_seconds(self):
        """Seconds step() spent in the client's calls (the network and the
        servers), so far."""
        return self._progress.exchange_seconds

    @property
    def optimizer(self):
        """The wrapped torch.optim optimizer (its step() is never called)."""
        return self._opt

    def _arrays(self, names=None):
        return self._staging.arrays(names)

    def _recover(self):
        """After a call failed: if a shard lost the model (it restarted
        without a checkpoint), hands it the parameters and pulls every
        weight afresh into them. False if that was not the failure."""
        with torch.no_grad():
            recovered = self._client.recover(self._arrays())
        if recovered:
            self._staging.to_model()
        return recovered

    def pull(self):
        """The servers' weights into the model's parameters."""
        with torch.no_grad():
            try:
                self._client.pull_into(self._arrays())
            except RuntimeError:
                if not self._recover():
                    raise
        self._staging.to_model()

    def zero_grad(self, set_to_none=None):
        """Clears the gradients, as the wrapped optimizer does (nothing
        else: model.zero_grad() is the same)."""
        if set_to_none is None:
            self._opt.zero_grad()
        else:
            self._opt.zero_grad(set_to_none=set_to_none)

    def _finish_overlapped(self):
        """overlap: the step's end (_torch_overlap.Overlap.finish)."""
        self._progress.exchange_seconds += self._overlapped.finish(
            self._staging, self._params, self._buffers, self._buffer_hyper,
            self._recover)
        self._progress.send()

    def _gradients(self):
        """(gradients, outputs, hyper-parameters) by name, for every
        parameter that has a gradient, and whether a CUDA copy of one is in
        flight. ValueError for a sparse gradient."""
        grads, out, hyper = {}, {}, {}
        cuda = False
        for group in self.param_groups:
            h = kinds.hyper(self._kind, group)
            for p in group["params"]:
                if p.grad is None:
                    # As PyTorch: no gradient, no update. In bsp the step
                    # counts it as zero from this rank (_exchange).
                    continue
                name = self._names[id(p)]
                if p.grad.is_sparse:
                    raise ValueError(f"parameter '{name}': sparse gradients "
                                     "are not supported")
                grads[name] = self._staging.gradient(name, p)
                cuda |= p.is_cuda
                out[name] = self._staging.host[name].numpy()
                hyper[name] = h
        return grads, out, hyper, cuda

    def _outer_exchange(self):
        """The end of a round of local steps (_torch_outer.Outer.exchange)."""
        self._progress.exchange_seconds += self._outer.exchange(
            self._client, self._staging, self._params, self._buffers,
            self._recover)
        self._progress.send()

    def _exchange(self):
        """Pushes every gradient as it is now, with its group's
        hyper-parameters, and writes the new weights into the parameters."""
        if self._outer is not None:
            return  # The outer optimizer exchanges at the end of a round.
        if self._overlapped is not None:
            self._finish_overlapped()
            return
        entered = time.perf_counter()
        grads, out, hyper, cuda = self._gradients()
        if not grads and self._client.mode != "bsp":
            return
        self._staging.buffers_to_host()
        for name in self._buffers:  # Their values, to be averaged in.
            grads[name] = out[name] = self._staging.host[name].numpy()
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
        self._staging.to_model()
        self._progress.exchange_seconds += network
        self._progress.send()
        # This wrapper's own cost: step() less the client's calls.
        self.wrapper_seconds += time.perf_counter() - entered - network

    def report(self, loss=None, samples=0):
        """Tells the servers of this step (its loss, the examples it
        trained on): psctl status and /metrics show Python workers as they
        show ps_worker. A step(closure) reports the closure's loss."""
        self._progress.add(loss, samples)

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
            self._progress.loss = float(loss)
        if self._outer is not None:
            self._opt.step()  # The inner optimizer, here.
            self._progress.step()
            if self._outer.due():
                self._outer_exchange()
            return loss
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
        load_state_dict it and go on. With outer=, the wrapped (inner)
        optimizer's own state, kept here."""
        saved = self._opt.state_dict()
        if self._outer is not None:
            return saved
        names = self._ordered()
        held = self._client.pull_state(names)
        state = {}
        for index, name in enumerate(names):
            s = kinds.torch_state(self._kind, held[name])
            if s is not None:
                state[index] = s
        saved["state"] = state
        return saved

    def load_state_dict(self, state_dict):
        """Takes the param groups' hyper-parameters (they reach the servers
        at the next step) and sends the per-parameter state to the servers;
        the weights stay theirs. With outer=, the wrapped (inner) optimizer
        takes it all."""
        if self._outer is not None:
            self._opt.load_state_dict(state_dict)
            return
        groups = state_dict["param_groups"]
        self._opt.load_state_dict({"state": {}, "param_groups": groups})
        names = self._ordered()
        order = [i for g in groups for i in g["params"]]
        if len(order) != len(names):
            raise ValueError(
                f"the state_dict has {len(order)} parameters; this optimizer "
                f"has {len(names)}")
        send = {}
        for index, name in zip(order, names):
            s = state_dict["state"].get(index)
            if s is None:
                continue
            s = kinds.server_state(self._kind, s)
            if s is not None:
                send[name] = s
        if send:
            self._client.load_state(send)

    def close(self):
        """Leaves the job (and, with overlap, removes the hooks)."""
        if self._overlapped is not None:
            self._overlapped.close()
        self._client.leave()

