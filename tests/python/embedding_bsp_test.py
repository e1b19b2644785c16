"""Sparse embedding tables in bsp from Python against real ps_server
processes: two workers' rows take each step's mean in lock step, a rank's
several row pushes in a step are summed, and a table a rank did not push
in a step counts as zero for it."""

import numpy as np
import pytest

import asyncps


def client(servers, **kw):
    """A client that retries for 5 s (as embedding_test.py's)."""
    kw.setdefault("retry_for", 5.0)
    return asyncps.Client(servers, **kw)


def test_bsp_workers_rows_take_each_steps_mean_in_lock_step(shards):
    """Two bsp workers (threads, a client each) through two shards: each
    step's rows move by the mean of both workers' gradients (AdaGrad), each
    worker's pull sees exactly the rows after the step before (held until
    the other worker pushed), and a worker with no ids on a shard in a step
    still completes that shard's step (its empty push counts)."""
    import threading

    servers = shards.start(2, "--mode=bsp")
    lr, acc0, dim, steps = 0.2, 0.1, 3, 5
    rng = np.random.default_rng(4)
    # Rank 0: four ids of 40, repeats likely; rank 1: one id on odd steps
    # (so one shard gets nothing from it there).
    batches = [[rng.integers(0, 40, 4) if r == 0 else
                rng.integers(0, 40, 1 if s % 2 else 5)
                for r in range(2)] for s in range(steps)]
    targets = [rng.standard_normal((40, dim)).astype(np.float32)
               for _ in range(2)]
    seen = [[None] * steps for _ in range(2)]
    errors = []

    def work(rank, c):
        try:
            for s in range(steps):
                ids = batches[s][rank].astype(np.int64)
                rows = c.pull_rows("items", ids)
                seen[rank][s] = rows.copy()
                c.push_rows("items", ids, rows - targets[rank][ids])
                c.end_step()
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    clients = [client(servers, rank=r, num_workers=2, mode="bsp")
               for r in range(2)]
    for c in clients:
        c.declare_embedding("items", dim, num_rows=40, optimizer="adagrad",
                            lr=lr, initial_accumulator_value=acc0, seed=5)
    w = clients[0].pull_rows("items", np.arange(40)).astype(np.float64)
    threads = [threading.Thread(target=work, args=(r, c))
               for r, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    acc = np.full((40, dim), acc0)
    for s in range(steps):
        grad = np.zeros((40, dim))
        touched = np.zeros(40, bool)
        for r in range(2):
            ids = batches[s][r]
            np.testing.assert_allclose(seen[r][s], w[ids], rtol=1e-5,
                                       atol=1e-6)
            np.add.at(grad, ids, w[ids] - targets[r][ids])
            touched[ids] = True
        grad /= 2  # The step's mean over the two workers.
        acc[touched] += grad[touched] ** 2
        w[touched] -= lr * grad[touched] / (np.sqrt(acc[touched]) + 1e-10)
    np.testing.assert_allclose(clients[0].pull_rows("items", np.arange(40)),
                               w, rtol=1e-5, atol=1e-6)
    for c in clients:
        c.leave()


# Regression (issue #38, 3): a rank's second row push in a bsp step was
# dropped with OK, and a table a rank did not push in a step stalled it.
@pytest.mark.parametrize("workers", [1, 2, 4])
def test_bsp_sums_a_ranks_pushes_and_counts_an_unused_table_as_zero(
        shards, workers):
    """SGD lr=1 from zeros, gradients exact in float32: each step moves a
    row by the sum of every push of it in the step over the number of
    ranks, whoever pushed it twice (two lookups of one table) and whoever
    did not touch the table at all in that step (it counts as zero); with
    one worker that is async's result."""
    import threading

    servers = shards.start(2, "--mode=bsp")
    steps = 4
    # plan[s][r]: (table, id, gradient) pushes of rank r in step s, each
    # push its own call; ranks skip tables in some steps.
    rng = np.random.default_rng(38 + workers)
    plan = [[[(t, int(rng.integers(0, 6)), float(rng.integers(-8, 9)) / 4)
              for t in ("a", "b") if (s + r + (t == "b")) % 3
              for _ in range(int(rng.integers(1, 3)))]
             for r in range(workers)] for s in range(steps)]
    errors = []

    def work(rank, c):
        try:
            for s in range(steps):
                for t, i, g in plan[s][rank]:
                    c.push_rows(t, [i], np.full((1, 2), g, np.float32))
                c.end_step()
                for t in ("a", "b"):  # Held until step s is applied.
                    c.pull_rows(t, np.arange(6))
        except Exception as e:  # noqa: BLE001 (re-raised below)
            errors.append(e)

    clients = [client(servers, rank=r, num_workers=workers, mode="bsp")
               for r in range(workers)]
    for c in clients:
        for t in ("a", "b"):
            c.declare_embedding(t, 2, num_rows=6, optimizer="sgd", lr=1.0,
                                init_stddev=0.0)
    threads = [threading.Thread(target=work, args=(r, c))
               for r, c in enumerate(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    assert not any(t.is_alive() for t in threads)
    want = {t: np.zeros((6, 2), np.float64) for t in ("a", "b")}
    for s in range(steps):
        for r in range(workers):
            for t, i, g in plan[s][r]:
                want[t][i] -= g / workers
    for t in ("a", "b"):
        np.testing.assert_array_equal(clients[0].pull_rows(t, np.arange(6)),
                                      want[t].astype(np.float32), t)
    for c in clients:
        c.leave()


LEAVER = r"""
import sys
import numpy as np
import asyncps
c = asyncps.Client(sys.argv[1].split(","), rank=0, num_workers=1,
                   mode="bsp", retry_for=5.0)
c.declare_embedding("e", 2, optimizer="sgd", lr=1.0, init_stddev=0.0,
                    max_rows_per_shard=2)
c.push_rows("e", np.arange(5, dtype=np.int64), np.ones((5, 2), np.float32))
c.end_step()  # The shard refuses 5 new rows where 2 fit.
c.leave()
print("left", flush=True)
"""


def test_a_failure_of_the_last_step_is_not_lost_at_leave(shards):
    """A bsp step's row push fails at end_step (a table holds 2 rows per
    shard; 5 come), and end_step keeps the failure for the next call. A
    worker that leaves then makes no next call: leave() says it (WARNING)
    instead of the failure going unseen."""
    import subprocess
    import sys

    servers = ",".join(shards.start(1, "--mode=bsp"))
    out = subprocess.run([sys.executable, "-c", LEAVER, servers],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "left" in out.stdout
    assert "leaves with its last step's failure unreported" in out.stderr, \
        out.stderr
    assert "embedding 'e'" in out.stderr, out.stderr
