"""asyncps.torch.DistributedOptimizer's state and the model's buffers: a
state_dict loads into plain PyTorch and back and training goes on alike (a
wrong shape changes nothing), overlap=True gives the default's weights or
refuses a gradient changed after it left, and BatchNorm's running
statistics are kept on the servers, uncompressed whatever the codec."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import asyncps
import asyncps.torch


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
