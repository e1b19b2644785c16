"""asyncps.torch.DistributedOptimizer wrapping real torch.optim optimizers:
one worker through one and two shards gives plain PyTorch's weights for the
same ordinary loop (param groups, an LR scheduler, clip_grad_norm_, two
backward passes per step, model.zero_grad(), a parameter with no
gradient).

The optimizer's state and the model's buffers on the servers:
optim_state_test.py; bsp with parameters some ranks leave without a
gradient: optim_bsp_test.py."""

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
