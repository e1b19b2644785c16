"""asyncps.Client against real ps_server processes: exact SGD, zero-copy
pulls, every wrong input refused with its exception and no weight moved, a
server gone, and the GIL released while a bsp pull waits."""

import threading

import numpy as np
import pytest

import asyncps
from conftest import run_ranks


def client(servers, **kw):
    kw.setdefault("retry_for", 5.0)
    kw.setdefault("slice_bytes", 16)  # Tensors spread over every shard.
    return asyncps.Client(servers, **kw)


def model():
    return {"w": np.arange(12, dtype=np.float32).reshape(3, 4),
            "b": np.zeros(4, dtype=np.float32)}


def test_declare_pull_push_give_exact_sgd(shards):
    servers = shards.start(2)
    with client(servers, rank=0, num_workers=1) as c:
        c.declare(model(), optimizer="sgd", lr=0.5)
        assert c.tensors == {"w": (3, 4), "b": (4,)}
        got = c.pull()
        np.testing.assert_array_equal(got["w"], model()["w"])
        assert got["w"].shape == (3, 4) and got["w"].dtype == np.float32
        c.push({"w": np.full((3, 4), 2.0, np.float32),
                "b": np.full(4, -4.0, np.float32)})
        c.end_step()
        assert c.clock == 1
        got = c.pull(["w", "b"])
        np.testing.assert_array_equal(got["w"], model()["w"] - 1.0)
        np.testing.assert_array_equal(got["b"], np.full(4, 2.0, np.float32))
        after = c.push_pull({"b": np.ones(4, np.float32)})
        np.testing.assert_array_equal(after["b"], np.full(4, 1.5, np.float32))


def test_compressed_pushes_keep_the_rest_for_the_next(shards):
    """compress="topk:0.5": each slice's larger half goes, the rest stays
    on the worker and is added to the next push (error feedback)."""
    servers = shards.start(1)
    with client(servers, rank=0, num_workers=1, compress="topk:0.5") as c:
        c.declare({"w": np.zeros(4, np.float32)}, optimizer="sgd", lr=1.0)
        c.push({"w": np.array([1, -4, 2, 0.5], np.float32)})
        np.testing.assert_array_equal(c.pull()["w"], [0, 4, -2, 0])
        c.push({"w": np.zeros(4, np.float32)})  # The residual goes now.
        np.testing.assert_array_equal(c.pull()["w"], [-1, 4, -2, -0.5])
    with pytest.raises(ValueError, match="topk:0"):
        client(servers, compress="topk:0")


def test_push_reports_what_the_servers_did(shards):
    servers = shards.start(2)
    with client(servers, rank=0, num_workers=1) as c:
        c.declare(model(), optimizer="sgd", lr=0.5)
        c.pull()
        g = {"w": np.ones((3, 4), np.float32)}
        first = c.push(g)
        assert first["slices"] >= 1, first
        assert first["staleness"] == 0 and first["dropped"] == 0, first
        # From the same weights again: one update behind on every slice.
        second = c.push(g)
        assert second["slices"] == first["slices"], second
        assert second["staleness"] == second["slices"], second
        assert second["max_staleness"] == 1, second


def test_delay_compensation_follows_the_formula(shards):
    """--stale_policy=dc:LAMBDA:WINDOW (DC-ASGD, issue #42): a push computed
    from weights others have moved since is applied as g + LAMBDA * g * g *
    (w_now - w_then); one older than the window as it is. The reference is
    numpy's, here."""
    lam, lr = 0.5, 0.25
    servers = shards.start(2, "--stale_policy=dc:0.5:2")
    a, b = (client(servers, rank=r, num_workers=2) for r in range(2))
    for c in (a, b):
        c.declare(model(), optimizer="sgd", lr=lr)
    w0 = a.pull()
    b.pull()  # b's gradients are computed from w0 from here on.
    ga = {k: np.full(v.shape, 1.5, np.float32) for k, v in w0.items()}
    gb = {k: np.linspace(-2, 2, v.size, dtype=np.float32).reshape(v.shape)
          for k, v in w0.items()}
    a.push(ga)
    assert b.push(gb)["max_staleness"] == 1
    w1 = {k: w0[k] - np.float32(lr) * ga[k] for k in w0}
    w2 = {}
    for k in w0:
        g = gb[k] + np.float32(lam) * gb[k] * gb[k] * (w1[k] - w0[k])
        w2[k] = w1[k] - np.float32(lr) * g
    got = a.pull()
    for k in w0:
        np.testing.assert_allclose(got[k], w2[k], rtol=1e-6, atol=1e-6)
    # Two more of a's, then b's from w0 again: 4 versions back, out of a
    # window of 2, applied as it is.
    a.push(ga)
    a.push(ga)
    w4 = a.pull()
    assert b.push(gb)["max_staleness"] == 4
    got = a.pull()
    for k in w0:
        np.testing.assert_allclose(got[k], w4[k] - np.float32(lr) * gb[k],
                                   rtol=1e-6, atol=1e-6)
    a.leave()
    b.leave()


def test_pull_into_writes_the_given_arrays(shards):
    servers = shards.start(1)
    with client(servers, rank=0, num_workers=1) as c:
        c.declare(model())
        mine = np.zeros((3, 4), np.float32)
        address = mine.ctypes.data
        c.pull_into({"w": mine})
        assert mine.ctypes.data == address  # Written in place, no copy.
        np.testing.assert_array_equal(mine, model()["w"])


def test_wrong_input_raises_and_changes_no_weight(shards):
    servers = shards.start(2)
    c = client(servers, rank=0, num_workers=1)
    with pytest.raises(RuntimeError, match="no model yet"):
        c.pull()
    c.declare(model(), lr=0.5)
    g = np.ones((3, 4), np.float32)
    with pytest.raises(KeyError, match="unknown tensor 'nope'"):
        c.push({"nope": g})
    with pytest.raises(ValueError, match="'w' has 12 elements but its buffer 6"):
        c.push({"w": np.ones(6, np.float32)})
    with pytest.raises(ValueError, match="dtype float64, want float32"):
        c.push({"w": np.ones((3, 4))})
    with pytest.raises(ValueError, match="not C-contiguous"):
        c.push({"w": np.ones((4, 3), np.float32).T})
    with pytest.raises(ValueError, match="want a numpy array"):
        c.push({"w": [1.0] * 12})
    nan = g.copy()
    nan[1, 2] = np.nan
    # The NaN's slice lives on one shard, the rest on the other: nothing of
    # the push may be applied anywhere.
    with pytest.raises(ValueError, match="'w' has NaN at element 6"):
        c.push({"w": nan})
    with pytest.raises(ValueError, match="Inf"):
        c.push_pull({"b": np.array([0, np.inf, 0, 0], np.float32)})
    with pytest.raises(ValueError, match="read-only"):
        frozen = np.zeros((3, 4), np.float32)
        frozen.flags.writeable = False
        c.pull_into({"w": frozen})
    with pytest.raises(RuntimeError, match="different model"):
        c.declare({"w": np.zeros((4, 3), np.float32),
                   "b": np.zeros(4, np.float32)})
    np.testing.assert_array_equal(c.pull()["w"], model()["w"])
    np.testing.assert_array_equal(c.pull()["b"], model()["b"])
    # A rank outside the job (not elastic): the servers refuse it.
    with pytest.raises(ValueError, match="rank 5 is outside"):
        client(servers, rank=5, num_workers=2)
    with pytest.raises(ValueError, match="rank -2 is outside"):
        client(servers, rank=-2, num_workers=2)
    # Every server gone: the call gives up after retry_for, saying so.
    shards.kill()
    with pytest.raises(ConnectionError, match="giving up"):
        c.push({"w": g})


def test_gil_is_released_while_a_bsp_pull_waits(shards):
    servers = shards.start(1, "--mode=bsp")
    a = client(servers, rank=0, num_workers=2, mode="bsp")
    b = client(servers, rank=1, num_workers=2, mode="bsp")
    a.declare(model(), lr=1.0)
    b.declare(model(), lr=1.0)
    ones = {"w": np.ones((3, 4), np.float32), "b": np.ones(4, np.float32)}
    a.push(ones)
    a.end_step()
    got = {}
    # A's pull of step 1 waits for B's push; B pushes from this thread, which
    # could not run if A's wait held the GIL.
    waiter = threading.Thread(target=lambda: got.update(a.pull()))
    waiter.start()
    threes = {k: 3 * v for k, v in ones.items()}
    b.push(threes)
    b.end_step()
    waiter.join(timeout=30)
    assert not waiter.is_alive()
    np.testing.assert_array_equal(got["w"], model()["w"] - 2.0)  # Mean: 2.
    a.leave()
    b.leave()


def test_bsp_issue_38_partial_step_neither_hangs_nor_refuses(shards):
    """Regression (issue #38, 2): rank 0 pushes a and b, rank 1 only a; in
    the next step rank 1 pushes both. That refused rank 1 (step 2 before
    step 1) and held rank 0's pull of b until it gave up."""
    servers = shards.start(2, "--mode=bsp")
    init = {"a": np.zeros(4, np.float32), "b": np.zeros(4, np.float32)}
    cs = [client(servers, rank=r, num_workers=2, mode="bsp")
          for r in range(2)]
    for c in cs:
        c.declare(init, optimizer="sgd", lr=1.0)
    got = [None, None]

    def work(rank):
        c = cs[rank]
        one = np.ones(4, np.float32)
        c.push_pull({"a": one, "b": one} if rank == 0 else {"a": one})
        got[rank] = c.pull(["a", "b"])  # Step 1 of both, held till done.
        c.push_pull({"a": one, "b": one})
        c.end_step()

    run_ranks(work, 2)
    for g in got:  # b: rank 0's 1 and rank 1's zero, over two ranks.
        np.testing.assert_array_equal(g["a"], -np.ones(4))
        np.testing.assert_array_equal(g["b"], np.full(4, -0.5))
    final = cs[0].pull()
    np.testing.assert_array_equal(final["a"], np.full(4, -2.0))
    np.testing.assert_array_equal(final["b"], np.full(4, -1.5))
    for c in cs:
        c.leave()


@pytest.mark.parametrize("workers", [2, 4])
def test_bsp_step_is_the_mean_with_a_missing_gradient_as_zero(shards,
                                                             workers):
    """Each rank pushes a different subset of the tensors each step (none
    at all in some steps, some tensors pushed by nobody); SGD lr=1 from
    zeros with gradients exact in float32. Every rank's pull of every
    tensor after each step equals the sum computed here of what was pushed
    over the number of ranks, in lock step."""
    servers = shards.start(2, "--mode=bsp")
    names = ("a", "b", "c")
    init = {n: np.zeros(5, np.float32) for n in names}
    steps = 6
    rng = np.random.default_rng(workers)
    plan = [[{n: rng.integers(-8, 9, 5).astype(np.float32) / 4
              for n in names if rng.random() < 0.5}
             for _ in range(workers)] for _ in range(steps)]
    plan[1] = [{} for _ in range(workers)]  # A step nobody pushes.
    cs = [client(servers, rank=r, num_workers=workers, mode="bsp")
          for r in range(workers)]
    for c in cs:
        c.declare(init, optimizer="sgd", lr=1.0)
    seen = [[None] * steps for _ in range(workers)]

    def work(rank):
        c = cs[rank]
        for s in range(steps):
            if plan[s][rank]:
                c.push(plan[s][rank])
            c.end_step()
            seen[rank][s] = c.pull()  # Held until step s + 1 is applied.

    run_ranks(work, workers)
    want = {n: np.zeros(5) for n in names}
    for s in range(steps):
        for n in names:
            for r in range(workers):
                if n in plan[s][r]:
                    want[n] -= plan[s][r][n] / workers
        for r in range(workers):
            for n in names:
                np.testing.assert_array_equal(seen[r][s][n], want[n],
                                              f"step {s} rank {r} {n}")
    for c in cs:
        c.leave()


def test_bsp_pull_after_a_shard_restart_pushes_the_step_again(shards,
                                                               tmp_path):
    """Regression (issue #38, 7, found by tools/reliability/history_check.py): a
    pull after end_step on a shard restored from an older checkpoint was
    answered ABORTED ("push step N's gradient again, then pull"), which the
    Python API could not do (end_step had moved the clock): the worker's
    gradient was lost. The client keeps the step's gradients in bsp and
    pushes them again itself."""
    servers = shards.start(1, "--mode=bsp", f"--checkpoint_dir={tmp_path}",
                           "--checkpoint_every=0s")
    c = client(servers, rank=0, num_workers=1, mode="bsp", retry_for=20.0)
    c.declare(model(), lr=1.0)
    ones = {"w": np.ones((3, 4), np.float32), "b": np.ones(4, np.float32)}
    c.push(ones)
    c.end_step()
    c.pull()
    shards.shards[0].stop()  # Drains: its checkpoint holds step 1.
    shards.shards[0].start()
    c.pull()  # The restored incarnation's weights, step 1.
    twos = {k: 2 * v for k, v in ones.items()}
    c.push(twos)  # Step 2, applied (one rank), then lost with the shard:
    c.end_step()
    shards.restart(0)  # SIGKILL; restored from step 1's checkpoint.
    got = c.pull()
    np.testing.assert_array_equal(got["w"], model()["w"] - 3.0)
    np.testing.assert_array_equal(got["b"], model()["b"] - 3.0)
    c.push(ones)  # And the job goes on at step 3.
    c.end_step()
    np.testing.assert_array_equal(c.pull()["b"], model()["b"] - 4.0)
    c.leave()


def test_bsp_step_without_gradients_after_a_shard_restart(shards, tmp_path):
    """Regression (found by tools/reliability/history_check.py): a rank that
    pushed no gradient in a step (end_step says so for every tensor) was refused
    by a shard restored from an older checkpoint ("bsp step 4 ... pushed
    before step 3 was applied"): its no-gradient marks named no
    incarnation, so the shard could not tell it had lost those steps."""
    servers = shards.start(1, "--mode=bsp", f"--checkpoint_dir={tmp_path}",
                           "--checkpoint_every=0s")
    c = client(servers, rank=0, num_workers=1, mode="bsp", retry_for=20.0)
    c.declare(model(), lr=1.0)
    ones = {"w": np.ones((3, 4), np.float32), "b": np.ones(4, np.float32)}
    c.push(ones)
    c.end_step()
    c.pull()
    shards.shards[0].stop()  # Drains: its checkpoint holds step 1.
    shards.shards[0].start()
    for _ in range(3):  # Steps 2-4 on the restored incarnation.
        c.pull()
        c.push(ones)
        c.end_step()
    c.pull()
    shards.restart(0)  # SIGKILL; restored from step 1's checkpoint.
    c.end_step()  # Step 5: no gradient at all.
    got = c.pull()
    np.testing.assert_array_equal(got["b"], model()["b"] - 1.0)
    c.push(ones)  # And the job goes on at step 6.
    c.end_step()
    np.testing.assert_array_equal(c.pull()["b"], model()["b"] - 2.0)
    c.leave()


def test_a_starting_worker_never_restores_a_lost_shard_with_initial_weights(
        shards):
    """Regression (issue #38, chaos sweep in bsp with no checkpoints: final
    accuracy 0.06): a worker starting while a shard had lost the model
    declared it there and sent its initial weights, which replaced that
    shard's trained ones while another worker held them. Neither its
    declare nor its recover does so now: the worker that pulled them
    restores the shard."""
    servers = shards.start(2, "--mode=async")
    trained = client(servers, rank=0, num_workers=2)
    trained.declare(model(), lr=1.0)
    trained.push({"w": np.ones((3, 4), np.float32),
                  "b": np.ones(4, np.float32)})
    held = trained.pull()
    want = {k: v - 1.0 for k, v in model().items()}

    def recovered_pull(c, arrays):
        try:
            return c.pull()
        except RuntimeError:
            assert c.recover(arrays)
            return c.pull()

    # A worker starting while shard 1 has lost the model: its declare
    # leaves that shard alone.
    shards.restart(1)
    starting = client(servers, rank=1, num_workers=2)
    starting.declare(model(), lr=1.0)
    got = recovered_pull(trained, held)
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
    for k, v in recovered_pull(starting, model()).items():
        np.testing.assert_array_equal(v, want[k])
    starting.leave()
    # Its recover with a copy it never pulled waits for one that was.
    shards.restart(1)
    again = client(servers, rank=1, num_workers=2)
    again.declare(model(), lr=1.0)
    initial = model()
    with pytest.raises(RuntimeError):
        again.pull()
    waited = {}
    t = threading.Thread(
        target=lambda: waited.update(ok=again.recover(initial)))
    t.start()
    got = recovered_pull(trained, held)
    t.join()
    assert waited["ok"]
    for k in want:
        np.testing.assert_array_equal(got[k], want[k])
        np.testing.assert_array_equal(initial[k], want[k])
    again.leave()
    trained.leave()
