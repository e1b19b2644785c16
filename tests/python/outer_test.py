"""Outer optimizers (DistributedOptimizer(..., outer=...), docs/MODES.md
"Outer optimizers") through real ps_server processes, each against the
same algorithm written out in plain PyTorch in the test: synchronous
DiLoCo in bsp, asynchronous DiLoCo with delayed Nesterov momentum, and
asynchronous EASGD; and the configurations they refuse."""

import copy
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import asyncps
import asyncps.torch
from conftest import run_ranks


def net():
    torch.manual_seed(3)
    return nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 2))


def batches(workers, steps, seed=11):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(6, 5, generator=g), torch.randn(6, 2, generator=g))
             for _ in range(steps)] for _ in range(workers)]


def local_step(model, inner, batch):
    inner.zero_grad()
    x, y = batch
    F.mse_loss(model(x), y).backward()
    inner.step()


def wrap(servers, model, rank, workers, mode, inner, **outer):
    c = asyncps.Client(servers, rank=rank, num_workers=workers, mode=mode,
                       slice_bytes=24, retry_for=10.0)
    return asyncps.torch.DistributedOptimizer(
        inner, c, named_parameters=model.named_parameters(), **outer)


def weights(servers):
    reader = asyncps.Client(servers, reader=True)
    try:
        reader.attach()
        return {n: torch.from_numpy(w) for n, w in reader.pull().items()}
    finally:
        reader.leave()


def assert_close(model, expected, atol=2e-5):
    for (name, p), q in zip(model.named_parameters(), expected.parameters()):
        assert torch.allclose(p.detach(), q.detach(), atol=atol), (
            name, (p.detach() - q.detach()).abs().max().item())


def assert_servers_hold(servers, expected, atol=2e-5):
    held = weights(servers)
    for name, q in expected.named_parameters():
        got = held[name].reshape(q.shape)
        assert torch.allclose(got, q.detach(), atol=atol), (
            name, (got - q.detach()).abs().max().item())


# Synchronous DiLoCo: each rank takes H AdamW steps of its own (its state
# kept across rounds), then the servers take one Nesterov step on the mean
# of the ranks' pseudo-gradients; every rank starts the next round there.
@pytest.mark.parametrize("workers", [2, 3])
def test_sync_diloco_in_bsp_is_the_reference(shards, workers):
    servers = shards.start(2, "--mode=bsp")
    H, rounds, outer_lr, mu = 3, 3, 0.7, 0.9
    data = batches(workers, H * rounds)
    start = net()
    models = [copy.deepcopy(start) for _ in range(workers)]
    opts = [wrap(servers, m, r, workers, "bsp",
                 torch.optim.AdamW(m.parameters(), lr=0.02),
                 outer="diloco", local_steps=H, outer_lr=outer_lr,
                 outer_momentum=mu) for r, m in enumerate(models)]
    def work(r):
        for s in range(H * rounds):
            local_step(models[r], opts[r], data[r][s])

    run_ranks(work, workers)

    # The reference, in plain PyTorch.
    centre = copy.deepcopy(start)
    outer = torch.optim.SGD(centre.parameters(), lr=outer_lr, momentum=mu,
                            nesterov=True)
    ref = [copy.deepcopy(start) for _ in range(workers)]
    inner = [torch.optim.AdamW(m.parameters(), lr=0.02) for m in ref]
    for k in range(rounds):
        for r in range(workers):
            with torch.no_grad():
                for p, c in zip(ref[r].parameters(), centre.parameters()):
                    p.copy_(c)
            for s in range(H):
                local_step(ref[r], inner[r], data[r][k * H + s])
        for i, c in enumerate(centre.parameters()):
            c.grad = sum(c.detach() - list(m.parameters())[i].detach()
                         for m in ref) / workers
        outer.step()
    for m in models:
        assert_close(m, centre)
    assert_servers_hold(servers, centre)
    # The inner optimizer's state stayed with the worker.
    assert opts[0].state_dict()["state"], "AdamW kept no state"
    for o in opts:
        o.close()


def check_in_turns(shards, inner, H, rounds, exchange, **outer):
    """Two async workers, each with the inner optimizer `inner(model)`, take
    rounds of H local steps in turn (0, 1, 0, 1, ...: the order of the
    pushes is fixed) through real servers, with `outer`'s arguments; the
    reference does the same in plain PyTorch, `exchange(r, params, centre,
    pushes)` being the algorithm's exchange of worker r (its parameters and
    the centre edited in place; `pushes` counted so far, this one
    included). The servers and every worker must hold the reference's
    weights."""
    servers = shards.start(2, "--mode=async")
    workers = 2
    data = batches(workers, H * rounds)
    start = net()
    models = [copy.deepcopy(start) for _ in range(workers)]
    opts = [wrap(servers, m, r, workers, "async", inner(m), local_steps=H,
                 **outer) for r, m in enumerate(models)]
    for k in range(rounds):
        for r, (o, m) in enumerate(zip(opts, models)):
            for s in range(H):
                local_step(m, o, data[r][k * H + s])

    centre = [p.detach().clone() for p in start.parameters()]
    ref = [copy.deepcopy(start) for _ in range(workers)]
    inners = [inner(m) for m in ref]
    pushes = 0
    for k in range(rounds):
        for r in range(workers):
            for s in range(H):
                local_step(ref[r], inners[r], data[r][k * H + s])
            pushes += 1
            with torch.no_grad():
                exchange(r, list(ref[r].parameters()), centre, pushes)
    expected = copy.deepcopy(start)
    with torch.no_grad():
        for p, c in zip(expected.parameters(), centre):
            p.copy_(c)
    assert_servers_hold(servers, expected)
    for m, r in zip(models, ref):
        assert_close(m, r)
    for o in opts:
        o.close()


# Asynchronous DiLoCo: each push is applied as it comes, its pseudo-
# gradient against the weights its worker started from (stale by the other
# worker's pushes); the momentum moves once per `workers` pushes.
def test_async_diloco_delayed_nesterov_is_the_reference(shards):
    workers, lr, mu = 2, 0.7, 0.9
    state = {}  # The servers' velocity and sum, the workers' anchors.

    def exchange(r, params, centre, pushes):
        if not state:
            state["v"] = [torch.zeros_like(c) for c in centre]
            state["sum"] = [torch.zeros_like(c) for c in centre]
            state["anchor"] = [[c.clone() for c in centre]
                               for _ in range(workers)]
        for i, p in enumerate(params):
            g = state["anchor"][r][i] - p
            state["sum"][i] += g
            centre[i] -= lr * (g / workers)
            if pushes % workers == 0:
                state["v"][i] = mu * state["v"][i] + state["sum"][i] / workers
                centre[i] -= lr * mu * state["v"][i]
                state["sum"][i].zero_()
        for i, p in enumerate(params):
            p.copy_(centre[i])
            state["anchor"][r][i] = centre[i].clone()

    check_in_turns(shards, lambda m: torch.optim.SGD(m.parameters(), lr=0.1),
                   2, 3, exchange, outer="diloco", outer_lr=lr,
                   outer_momentum=mu)


# Asynchronous EASGD: every tau steps a worker and the centre move toward
# each other by alpha times their difference, in one exchange.
def test_async_easgd_is_the_reference(shards):
    alpha = 0.3

    def exchange(r, params, centre, pushes):
        for i, p in enumerate(params):
            diff = alpha * (p - centre[i])
            centre[i] += diff
            p -= diff

    check_in_turns(
        shards,
        lambda m: torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5),
        2, 3, exchange, outer="easgd", alpha=alpha)


def test_bad_outer_configurations_are_refused(shards):
    servers = shards.start(1, "--mode=bsp")
    model = net()
    c = asyncps.Client(servers, rank=0, num_workers=1, mode="bsp")
    sgd = torch.optim.SGD(model.parameters(), lr=0.1)
    for kwargs, words in [
            (dict(outer="local"), "outer = 'local'"),
            (dict(outer="diloco", local_steps=0), "local_steps = 0"),
            (dict(outer="diloco", local_steps=2.5), "local_steps = 2.5"),
            (dict(outer="diloco", outer_lr=-1.0), "outer_lr"),
            (dict(outer="diloco", outer_momentum=1.0), "outer_momentum"),
            (dict(outer="easgd"), "asynchronous EASGD"),
            (dict(outer="diloco", overlap=True), "overlap=True"),
            (dict(outer="diloco", dynamic_local_steps=True),
             "dynamic_local_steps is asynchronous DiLoCo's")]:
        with pytest.raises(ValueError, match=words):
            asyncps.torch.DistributedOptimizer(sgd, c, **kwargs)
    # The servers refuse an asynchronous outer kind in bsp, naming it.
    arrays = {"w": model[0].weight.detach().numpy().copy()}
    for kind in ("delayed_nesterov", "elastic"):
        with pytest.raises(ValueError, match=f"optimizer {kind} is an "
                           "asynchronous outer optimizer"):
            c.declare(arrays, optimizer=kind, lr=0.5, momentum=0.9)
    with pytest.raises(ValueError, match="delay"):
        c.declare(arrays, optimizer="delayed_nesterov", lr=0.7, delay=0)
    c.leave()


def test_dynamic_round_steps():
    from asyncps._torch_outer import dynamic_round_steps
    assert dynamic_round_steps(8, 1.0, 4.0) == 2
    assert dynamic_round_steps(8, 4.0, 4.0) == 8
    assert dynamic_round_steps(8, 0.1, 4.0) == 1
    assert dynamic_round_steps(8, 6.0, 4.0) == 8
    assert dynamic_round_steps(8, 0.0, 4.0) == 8
    assert dynamic_round_steps(8, 2.0, 0.0) == 8


def test_dynamic_rounds_follow_the_rates():
    from asyncps._torch_outer import Outer
    rates = [(1.0, 4.0)]  # (mine, fastest), as the optimizer measures them.
    o = Outer("diloco", "async", 2, 8, 0.7, 0.9, None, dynamic=True,
              rates=lambda: rates[0])
    # The first round is the full 8 steps (no rate known before it).
    assert [o.due() for _ in range(8)] == [False] * 7 + [True]
    assert o.round_steps == 2
    rates[0] = (4.0, 4.0)  # Caught up: the next round is 8 again.
    assert [o.due() for _ in range(2)] == [False, True]
    assert o.round_steps == 8
    with pytest.raises(ValueError, match="dynamic_local_steps"):
        Outer("diloco", "ssp", 2, 8, 0.7, 0.9, None, dynamic=True)


def wait_for(condition, what, seconds=20.0):
    """Polls `condition` until true; fails naming `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# The servers answer each heartbeat with the fastest rate among the live
# workers (async DiLoCo's dynamic rounds scale by it).
def test_heartbeats_answer_the_fastest_live_workers_rate(shards):
    servers = shards.start(2, "--mode=async")
    fast, slow = (asyncps.Client(servers, rank=r, num_workers=2,
                                 mode="async", heartbeat=0.02)
                  for r in range(2))
    fast.report(steps_per_second=40.0)
    slow.report(steps_per_second=10.0)
    wait_for(lambda: slow.fastest_steps_per_second == 40.0, "40 steps/s")
    fast.leave()  # No longer the job's pace.
    wait_for(lambda: slow.fastest_steps_per_second == 10.0, "10 steps/s")
    slow.leave()


def test_servers_refuse_outer_kinds_with_dc_and_for_tables(shards):
    servers = shards.start(1, "--mode=async", "--stale_policy=dc:0.04")
    c = asyncps.Client(servers, rank=0, num_workers=1, mode="async")
    arrays = {"w": torch.zeros(3, 2).numpy()}
    with pytest.raises(ValueError, match="delay compensation is for "
                       "gradients"):
        c.declare(arrays, optimizer="delayed_nesterov", lr=0.7, delay=2)
    with pytest.raises(ValueError, match="moving rate"):
        c.declare(arrays, optimizer="elastic", lr=0.3)
    with pytest.raises(ValueError, match="outer optimizer of the dense"):
        c.declare_embedding("items", 4, optimizer="elastic", lr=0.3)
    c.declare(arrays, optimizer="sgd", lr=0.1)  # Nothing was left behind.
    c.leave()
