"""asyncps.torch.DistributedOptimizer in bsp with parameters that some
ranks leave without a gradient (unused branches): each step is the mean
over every rank, the missing ones counting as zero, also when a shard lost
the model mid-step and the step is pushed again."""

import copy

import numpy as np
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import asyncps
import asyncps.torch
from conftest import run_ranks


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
    def work(r):
        for s in range(steps):
            x, y = data[s][r]
            opts[r].zero_grad()
            F.mse_loss(models[r](x, used_heads(r, s)), y).backward()
            opts[r].step()

    run_ranks(work, workers)

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
# tests/integration/ps_exchange_bsp_test, BspRecoverStepTest).
def test_bsp_step_after_a_lost_model_is_pushed_again(shards):
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
    def steps(r, which):
        for s in which:
            x, y = data[s][r]
            opts[r].zero_grad()
            F.mse_loss(models[r](x, [0, 1, 2]), y).backward()
            opts[r].step()

    for which in ([0], [1, 2]):
        run_ranks(lambda r: steps(r, which), 2)
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
