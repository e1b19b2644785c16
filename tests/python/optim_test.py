"""asyncps.torch.DistributedOptimizer wrapping real torch.optim optimizers:
one worker through one and two shards gives plain PyTorch's weights for the
same ordinary loop (param groups, an LR scheduler, clip_grad_norm_, two
backward passes per step, model.zero_grad(), a parameter with no
gradient)."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import asyncps
import asyncps.torch


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(8, 6)
        self.b = nn.Linear(6, 3)
        self.unused = nn.Linear(3, 3)  # Never in the graph: grad None.

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def groups(model):
    """No weight decay on biases, another learning rate for layer b."""
    decay = [model.a.weight, model.unused.weight]
    plain = [model.a.bias, model.unused.bias]
    return [{"params": decay},
            {"params": plain, "weight_decay": 0.0},
            {"params": [model.b.weight, model.b.bias], "lr_scale": 0.5}]


OPTIMIZERS = {
    "sgd": (lambda p: torch.optim.SGD(p, lr=0.1, weight_decay=0.01), 1e-5),
    "momentum": (lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, dampening=0.1, nesterov=False,
        weight_decay=0.01), 1e-5),
    "nesterov": (lambda p: torch.optim.SGD(
        p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), 1e-5),
    "adam": (lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01), 1e-4),
    "adamw": (lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
              1e-4),
    "adagrad": (lambda p: torch.optim.Adagrad(
        p, lr=0.1, lr_decay=0.01, weight_decay=0.01,
        initial_accumulator_value=0.1), 1e-4),
}


def train(model, opt, data):
    """An ordinary PyTorch loop: two backward passes per step (gradient
    accumulation), clipping, a scheduler, model.zero_grad()."""
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    for x, y in data:
        model.zero_grad()
        F.cross_entropy(model(x[:8]), y[:8]).backward()
        F.cross_entropy(model(x[8:]), y[8:]).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        opt.step()
        sched.step()


@pytest.mark.parametrize("num_shards", [1, 2])
@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_weights_equal_plain_pytorch(shards, name, num_shards):
    make, tol = OPTIMIZERS[name]
    servers = shards.start(num_shards, "--mode=async")
    torch.manual_seed(3)
    model = Net()
    reference = copy.deepcopy(model)
    initial = copy.deepcopy(model)
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(16, 8, generator=g),
             torch.randint(0, 3, (16,), generator=g)) for _ in range(8)]

    def build(m):
        gs = groups(m)
        for group in gs:
            if group.pop("lr_scale", None):
                group["lr"] = make([torch.zeros(1)]).defaults["lr"] * 0.5
        return make(gs)

    client = asyncps.Client(servers, rank=0, num_workers=1, mode="async",
                            slice_bytes=64)  # Layers cut over the shards.
    opt = asyncps.torch.DistributedOptimizer(
        build(model), client, named_parameters=model.named_parameters())
    assert isinstance(opt, torch.optim.Optimizer)
    train(model, opt, data)
    ref_opt = build(reference)
    train(reference, ref_opt, data)
    assert client.clock == len(data)
    assert opt.param_groups[0]["lr"] == ref_opt.param_groups[0]["lr"]
    served = opt.client.pull()
    for (n, p), (_, q) in zip(model.named_parameters(),
                              reference.named_parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(),
                                   rtol=tol, atol=tol, err_msg=n)
        np.testing.assert_array_equal(served[n], p.detach().numpy(),
                                      err_msg=n)
    # Training moved them, and the unused layer stayed where it was.
    assert not torch.allclose(model.a.weight, initial.a.weight, atol=1e-3)
    assert torch.equal(model.unused.weight, initial.unused.weight)
    opt.close()


def test_refuses_other_optimizers_by_name(shards):
    servers = shards.start(1)
    client = asyncps.Client(servers, rank=0, num_workers=1)
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="wraps torch.optim.SGD.*RMSprop"):
        asyncps.torch.DistributedOptimizer(
            torch.optim.RMSprop(model.parameters()), client)
    with pytest.raises(ValueError, match="amsgrad"):
        asyncps.torch.DistributedOptimizer(
            torch.optim.Adam(model.parameters(), amsgrad=True), client)
    client.leave()


def test_synchronize_then_skip_synchronize_sends_once(shards):
    servers = shards.start(1)
    torch.manual_seed(1)
    model = nn.Linear(4, 2)
    client = asyncps.Client(servers, rank=0, num_workers=1)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), client,
        named_parameters=model.named_parameters())
    F.mse_loss(model(torch.ones(3, 4)), torch.zeros(3, 2)).backward()
    opt.synchronize()
    with opt.skip_synchronize():
        opt.step()
    assert client.clock == 1
    opt.step()  # Outside the block: sends again.
    assert client.clock == 2
    opt.close()


class HalfOnCpu(nn.Module):
    """PyTorch 1.13 has no float16 matmul on the CPU: float16 parameters,
    float32 arithmetic."""

    def __init__(self):
        super().__init__()
        self.a = nn.Parameter((torch.randn(8, 4) * 0.5).half())
        self.b = nn.Parameter((torch.randn(2, 8) * 0.5).half())

    def forward(self, x):
        return F.linear(torch.relu(F.linear(x, self.a.float())), self.b.float())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_parameters_train_on_float32_masters(shards, dtype):
    """bf16/f16 parameters: the servers keep float32 weights, the model
    gets them rounded to its dtype, and training lowers the loss."""
    servers = shards.start(2)
    torch.manual_seed(7)
    if dtype == torch.float16:
        model = HalfOnCpu()
    else:
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
        model = model.to(dtype)
    client = asyncps.Client(servers, rank=0, num_workers=1, slice_bytes=64)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5), client,
        named_parameters=model.named_parameters())
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    losses = []
    for _ in range(40):
        opt.zero_grad()
        xin = x if dtype == torch.float16 else x.to(dtype)
        loss = F.cross_entropy(model(xin).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses
    # The wire carries the parameter's dtype: a pull of every weight
    # receives 2 bytes an element fewer than an f32 reader's (the rest of
    # the answers is the same).
    wire = {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]
    assert set(client.wire_dtypes.values()) == {wire}, client.wire_dtypes
    reader = asyncps.Client(servers, reader=True)
    reader.attach()
    assert set(reader.wire_dtypes.values()) == {"f32"}
    got = []
    for c in (client, reader):
        before = c.traffic["received_bytes"]
        c.pull()
        got.append(c.traffic["received_bytes"] - before)
    reader.leave()
    elements = sum(p.numel() for p in model.parameters())
    assert got[1] - got[0] == 2 * elements, got
    served = client.pull()
    for name, p in model.named_parameters():
        assert p.dtype == dtype
        assert served[name].dtype == np.float32
        # The parameter is the master weight rounded to its dtype.
        np.testing.assert_array_equal(
            torch.from_numpy(served[name]).to(dtype).float().numpy(),
            p.detach().float().numpy(), err_msg=name)
    opt.close()


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="no CUDA device on this machine: CUDA parameters "
                    "are tested where torch.cuda.is_available()")
def test_cuda_parameters_equal_plain_pytorch(shards):
    servers = shards.start(1)
    torch.manual_seed(3)
    model = Net().cuda()
    reference = copy.deepcopy(model)
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(16, 8, generator=g).cuda(),
             torch.randint(0, 3, (16,), generator=g).cuda())
            for _ in range(8)]
    client = asyncps.Client(servers, rank=0, num_workers=1)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9), client,
        named_parameters=model.named_parameters())
    train(model, opt, data)
    train(reference, torch.optim.SGD(reference.parameters(), lr=0.1,
                                     momentum=0.9), data)
    for (n, p), q in zip(model.named_parameters(), reference.parameters()):
        assert p.is_cuda
        np.testing.assert_allclose(p.detach().cpu().numpy(),
                                   q.detach().cpu().numpy(), rtol=1e-5,
                                   atol=1e-5, err_msg=n)
    opt.close()


def state_model():
    torch.manual_seed(11)
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 2))


STATEFUL = {
    "momentum": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01),
    "adamw": lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1),
    "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
}


def steps(model, opt, data):
    for x, y in data:
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()


def batches(seed, n):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 6, generator=g),
             torch.randint(0, 2, (8,), generator=g)) for _ in range(n)]


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_state_dict_loads_into_plain_pytorch(shards, name):
    """state_dict() from the servers loads into a plain torch.optim
    optimizer and both go on to the same weights."""
    make = STATEFUL[name]
    servers = shards.start(2)
    model = state_model()
    client = asyncps.Client(servers, rank=0, num_workers=1, slice_bytes=64)
    opt = asyncps.torch.DistributedOptimizer(
        make(model.parameters()), client,
        named_parameters=model.named_parameters())
    steps(model, opt, batches(1, 4))
    # Out to a plain optimizer, on a copy of the model: the same future.
    plain_model = copy.deepcopy(model)
    plain = make(plain_model.parameters())
    plain.load_state_dict(opt.state_dict())
    later = batches(2, 3)
    steps(model, opt, later)
    steps(plain_model, plain, later)
    for (n, p), q in zip(model.named_parameters(), plain_model.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=n)
    opt.close()


@pytest.mark.parametrize("name", sorted(STATEFUL))
def test_load_state_dict_of_plain_pytorch_goes_on_alike(shards, name):
    """A plain optimizer's state loaded onto the servers: a job starting
    from its weights and state continues as the plain one does."""
    make = STATEFUL[name]
    reference = state_model()
    ref_opt = make(reference.parameters())
    steps(reference, ref_opt, batches(3, 4))
    servers = ",".join(shards.start(1))
    resumed = copy.deepcopy(reference)
    client = asyncps.Client(servers, rank=0, num_workers=1)
    opt = asyncps.torch.DistributedOptimizer(
        make(resumed.parameters()), client,
        named_parameters=resumed.named_parameters())
    opt.load_state_dict(ref_opt.state_dict())
    later = batches(4, 3)
    steps(resumed, opt, later)
    steps(reference, ref_opt, later)
    for (n, p), q in zip(resumed.named_parameters(), reference.parameters()):
        np.testing.assert_allclose(p.detach().numpy(), q.detach().numpy(),
                                   rtol=1e-4, atol=1e-5, err_msg=n)
    opt.close()


def test_load_state_dict_of_the_wrong_shape_changes_nothing(shards):
    servers = shards.start(1)
    model = state_model()
    client = asyncps.Client(servers, rank=0, num_workers=1)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=0.01), client,
        named_parameters=model.named_parameters())
    steps(model, opt, batches(1, 2))
    before = client.pull_state()
    bad = opt.state_dict()
    bad["state"][0]["exp_avg"] = torch.zeros(3)  # Not the weight's shape.
    with pytest.raises(ValueError, match="does not have its 30 elements"):
        opt.load_state_dict(bad)
    after = client.pull_state()
    for n in before:
        np.testing.assert_array_equal(before[n]["slot1"], after[n]["slot1"])
    opt.close()


def test_overlap_matches_the_default_and_refuses_changed_gradients():
    """overlap=True (pushes during backward) gives the default's weights
    when nothing touches the gradients after backward, and refuses, naming
    the parameter, a gradient clipped or accumulated after it left."""
    from conftest import SERVER, Shards

    def run(overlap, shards):
        model = state_model()
        client = asyncps.Client(shards.start(1), rank=0, num_workers=1)
        opt = asyncps.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
            client, named_parameters=model.named_parameters(),
            overlap=overlap)
        steps(model, opt, batches(5, 4))
        return model, opt

    plain, overlapped = Shards(SERVER), Shards(SERVER)
    try:
        model, opt = run(False, plain)
        opt.close()
        other, opt = run(True, overlapped)
        for (n, p), q in zip(model.named_parameters(), other.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-6, msg=n)
        x, y = batches(6, 1)[0]
        opt.zero_grad()
        F.cross_entropy(other(x), y).backward()
        torch.nn.utils.clip_grad_norm_(other.parameters(), 1e-3)
        with pytest.raises(RuntimeError, match="gradient of '2.bias' changed after"):
            opt.step()
        opt.zero_grad()
        F.cross_entropy(other(x), y).backward()
        F.cross_entropy(other(x), y).backward()
        with pytest.raises(RuntimeError, match="second backward"):
            opt.step()
        opt.close()
    finally:
        plain.kill()
        overlapped.kill()


class BatchNormNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.b = nn.Linear(8, 2)

    def forward(self, x):
        return self.b(torch.relu(self.bn(self.a(x))))


# Regression (issue #38, 5): top-k pulled buffers toward zero, one-bit made
# them +-mean, bf16 rounded them: a buffer now travels uncompressed with
# every codec, and error feedback never sees it.
@pytest.mark.parametrize("compress", ["none", "bf16", "topk:0.1", "onebit"])
def test_batchnorm_buffers_are_kept_on_the_servers(shards, tmp_path,
                                                    compress):
    """sync_buffers: the servers hold the running statistics; with one
    worker they equal its own (whatever the gradients' codec), and a model
    filled from the servers (asyncps.torch.load_state_dict) evaluates
    exactly as the worker's."""
    servers = shards.start(2)
    torch.manual_seed(4)
    model = BatchNormNet()
    client = asyncps.Client(servers, rank=0, num_workers=1, slice_bytes=64,
                            compress=compress)
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1), client,
        named_parameters=model.named_parameters(),
        named_buffers=model.named_buffers())
    g = torch.Generator().manual_seed(5)
    for _ in range(6):
        x = torch.randn(16, 6, generator=g) * 3 + 1
        y = torch.randint(0, 2, (16,), generator=g)
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    served = client.pull()
    assert served["bn.running_mean"].any()  # Moved from their start.
    for name in ("bn.running_mean", "bn.running_var"):
        np.testing.assert_allclose(served[name],
                                   dict(model.named_buffers())[name].numpy(),
                                   rtol=1e-6, err_msg=name)
    assert "bn.num_batches_tracked" not in served  # Integers stay local.
    fresh = BatchNormNet()
    asyncps.torch.load_state_dict(fresh, ",".join(servers))
    model.eval()
    fresh.eval()
    x = torch.randn(32, 6, generator=g)
    torch.testing.assert_close(fresh(x), model(x))
    opt.close()


class Branches(nn.Module):
    """A shared trunk and three heads; each call uses the heads it is told
    (an unused branch, a mixture of experts: grad None elsewhere)."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 5)
        self.heads = nn.ModuleList(nn.Linear(5, 2) for _ in range(3))

    def forward(self, x, used):
        h = torch.tanh(self.trunk(x))
        return sum(self.heads[k](h) for k in used)


def used_heads(rank, step):
    """Differs by rank and by step; at step 3 no rank uses head 2."""
    return [k for k in range(3)
            if (rank + step + k) % 3 != 0 and not (step == 3 and k == 2)]


# Regression (issue #38, 2): a parameter with no gradient on one bsp rank
# hung the job (its step waited for that rank). The rule: that rank counts
# as zero and the step is the mean over every rank, as DDP's.
@pytest.mark.parametrize("workers", [2, 4])
def test_bsp_branches_used_by_some_ranks_step_as_the_mean_with_zeros(
        shards, workers):
    import threading

    servers = shards.start(2, "--mode=bsp")
    torch.manual_seed(8)
    start = Branches()
    steps = 5
    g = torch.Generator().manual_seed(9)
    data = [[(torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g))
             for _ in range(workers)] for _ in range(steps)]
    lr, momentum = 0.1, 0.9
    models = [copy.deepcopy(start) for _ in range(workers)]
    opts = []
    for r, m in enumerate(models):
        c = asyncps.Client(servers, rank=r, num_workers=workers, mode="bsp",
                           slice_bytes=32, retry_for=10.0)
        opts.append(asyncps.torch.DistributedOptimizer(
            torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum), c,
            named_parameters=m.named_parameters()))
    errors = []

    def work(r):
        try:
            for s in range(steps):
                x, y = data[s][r]
                opts[r].zero_grad()
                F.mse_loss(models[r](x, used_heads(r, s)), y).backward()
                opts[r].step()
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    threads = [threading.Thread(target=work, args=(r,))
               for r in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a rank hangs"
    assert not errors, errors

    # One process, the mean of the ranks' losses: DDP's gradient, with a
    # head no rank used left without one (and so not stepped).
    reference = copy.deepcopy(start)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr,
                              momentum=momentum)
    for s in range(steps):
        ref_opt.zero_grad()
        loss = sum(F.mse_loss(reference(*[data[s][r][0]],
                                        used_heads(r, s)), data[s][r][1])
                   for r in range(workers)) / workers
        loss.backward()
        ref_opt.step()
    for r in range(workers):
        for (n, p), (_, q) in zip(models[r].named_parameters(),
                                  reference.named_parameters()):
            np.testing.assert_allclose(p.detach().numpy(),
                                       q.detach().numpy(), rtol=1e-5,
                                       atol=1e-6, err_msg=f"rank {r} {n}")
    for o in opts:
        o.close()


# Issue #38, 7: after a bsp step broke off on a shard that lost the model
# (restarted without a checkpoint), the optimizer restores it from its copy
# and pushes the step again, so the step is exactly the mean of both ranks'
# gradients on every shard (as the C++ exchanges do:
# tests/integration/ps_exchange_test, BspRecoverStepTest).
def test_bsp_step_after_a_lost_model_is_pushed_again(shards):
    import threading

    servers = shards.start(2, "--mode=bsp")
    torch.manual_seed(11)
    start = Branches()
    g = torch.Generator().manual_seed(12)
    data = [[(torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g))
             for _ in range(2)] for _ in range(3)]
    models = [copy.deepcopy(start) for _ in range(2)]
    opts = [asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(m.parameters(), lr=0.1), asyncps.Client(
            servers, rank=r, num_workers=2, mode="bsp", slice_bytes=32,
            retry_for=20.0), named_parameters=m.named_parameters())
        for r, m in enumerate(models)]
    errors = []

    def steps(r, which):
        try:
            for s in which:
                x, y = data[s][r]
                opts[r].zero_grad()
                F.mse_loss(models[r](x, [0, 1, 2]), y).backward()
                opts[r].step()
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    for which in ([0], [1, 2]):
        threads = [threading.Thread(target=steps, args=(r, which))
                   for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not any(t.is_alive() for t in threads), "a rank hangs"
        assert not errors, errors
        if which == [0]:
            shards.restart(1)  # Its model is lost between steps 1 and 2.
    reference = copy.deepcopy(start)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1)
    for s in range(3):
        ref_opt.zero_grad()
        (sum(F.mse_loss(reference(data[s][r][0], [0, 1, 2]), data[s][r][1])
             for r in range(2)) / 2).backward()
        ref_opt.step()
    for r in range(2):
        for (n, p), (_, q) in zip(models[r].named_parameters(),
                                  reference.named_parameters()):
            np.testing.assert_allclose(p.detach().numpy(),
                                       q.detach().numpy(), rtol=1e-5,
                                       atol=1e-6, err_msg=f"rank {r} {n}")
    for o in opts:
        o.close()
