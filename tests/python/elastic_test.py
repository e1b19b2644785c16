"""Elastic jobs (ps_server --elastic, docs/ELASTIC.md) against real
ps_server processes: workers join and leave while the job trains, in bsp
(each step exactly the mean of its members: a joiner counts from the next
step, a leaver not after it), ssp (a joiner holds no one back) and async
(a joiner's first push is applied); and ps_worker processes joining,
SIGTERMed and SIGKILLed in each mode, allreduce included, the rest
finishing."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import asyncps

PS_WORKER = os.environ.get("ASYNCPS_PS_WORKER", "worker/ps_worker")


def client(servers, mode, rank=-1, **kw):
    kw.setdefault("retry_for", 10.0)
    kw.setdefault("slice_bytes", 16)  # Tensors spread over every shard.
    kw.setdefault("heartbeat", 0.1)
    return asyncps.Client(servers, rank=rank, num_workers=2, mode=mode, **kw)


def wait_for(what, timeout=20.0):
    """Polls `what()` until it is true (membership views move with
    heartbeats); fails after `timeout` seconds."""
    end = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.05)


def test_bsp_each_step_is_the_mean_of_its_members_as_they_join_and_leave(
        shards):
    """Ranks 0 and 1 train; rank 2 joins while step 2 is half pushed (it
    counts from step 3, and step 2 does not wait for it); rank 1 leaves
    after step 4; rank 3 joins between steps 6 and 7. Every member's pull
    after each step equals the float32 mean of what the step's members
    pushed, computed here (SGD, lr 1, integer gradients)."""
    servers = shards.start(2, "--mode=bsp", "--elastic")
    init = {"a": np.zeros(6, np.float32), "b": np.zeros(3, np.float32)}
    want = {n: v.copy() for n, v in init.items()}
    rng = np.random.default_rng(41)
    members = {r: client(servers, "bsp", rank=r) for r in (0, 1)}
    for c in members.values():
        c.declare(init, optimizer="sgd", lr=1.0)

    def grads():
        return {n: rng.integers(-6, 7, v.shape).astype(np.float32)
                for n, v in init.items()}

    def step(pushes, late=()):
        """Every member pushes (`late` ones after the rest); then all
        pull, and each sees the mean of the members' gradients."""
        order = [r for r in members if r not in late] + list(late)
        total = {n: np.zeros_like(v) for n, v in init.items()}
        for r in order:
            members[r].push(pushes[r])
            members[r].end_step()
            for n in total:
                total[n] += pushes[r][n]
        inv = np.float32(1) / np.float32(len(order))
        for n in want:
            want[n] = want[n] - total[n] * inv
        for r, c in members.items():
            got = c.pull()
            for n in want:
                np.testing.assert_array_equal(got[n], want[n],
                                              f"rank {r} {n}")

    for _ in range(2):
        step({r: grads() for r in members})
    # Step 2: rank 0 pushes; rank 2 joins; then rank 1 pushes.
    g = {r: grads() for r in members}
    members[0].push(g[0])
    members[0].end_step()
    joiner = client(servers, "bsp")
    assert joiner.rank == 2
    assert joiner.clock == 3  # Step 2 is clock 3: it sends clock 4 first.
    m = joiner.members()
    assert m["elastic"] and m["live_ranks"] == [0, 1, 2], m
    assert (m["index"], m["size"]) == (2, 3)
    members[1].push(g[1])
    members[1].end_step()
    joiner.attach()  # Returns once step 2 is applied (AwaitJoinedStep).
    for n in want:
        want[n] = want[n] - (g[0][n] + g[1][n]) * (np.float32(1) /
                                                   np.float32(2))
    for c in (members[0], members[1], joiner):
        got = c.pull()
        for n in want:
            np.testing.assert_array_equal(got[n], want[n], n)
    members[2] = joiner
    for _ in range(2):
        step({r: grads() for r in members}, late=(2,))
    members.pop(1).leave()
    wait_for(lambda: members[0].members()["size"] == 2)
    assert members[2].members()["index"] == 1 or wait_for(
        lambda: members[2].members()["index"] == 1) is None
    for _ in range(2):
        step({r: grads() for r in members})
    members[3] = client(servers, "bsp")
    members[3].attach()
    assert members[3].rank == 1  # The lowest rank not live.
    members[1] = members.pop(3)
    step({r: grads() for r in members})
    for c in members.values():
        c.leave()


def test_bsp_a_joiner_may_push_before_it_pulls(shards):
    """A joiner at front M sends step M + 1 first; attach() waits for step
    M (a shard would refuse a push of M + 1 before M is applied). Rank 0
    has pushed step M when rank 2 joins and pushes at once; rank 1 pushes
    step M after that: M is the mean of 0 and 1, M + 1 of all three."""
    servers = shards.start(2, "--mode=bsp", "--elastic")
    init = {"w": np.zeros(8, np.float32)}
    a, b = client(servers, "bsp", rank=0), client(servers, "bsp", rank=1)
    a.declare(init, optimizer="sgd", lr=1.0)
    b.attach()
    a.push({"w": np.full(8, 2.0, np.float32)})
    a.end_step()
    result = {}

    def join():
        c = client(servers, "bsp")
        c.attach()  # Held until step 1 is applied.
        c.push({"w": np.full(8, 9.0, np.float32)})
        c.end_step()
        result["c"] = c

    t = threading.Thread(target=join)
    t.start()
    wait_for(lambda: len(a.members()["live_ranks"]) == 3)
    b.push({"w": np.full(8, 4.0, np.float32)})
    b.end_step()
    t.join(timeout=60)
    assert "c" in result, "the joiner did not get in"
    c = result["c"]
    np.testing.assert_array_equal(a.pull()["w"], np.full(8, -3.0))
    for x in (a, b):
        x.push({"w": np.full(8, 3.0, np.float32)})
        x.end_step()
    for x in (a, b, c):
        np.testing.assert_array_equal(x.pull()["w"], np.full(8, -8.0))
        x.leave()


def test_bsp_a_joiner_may_push_rows_before_it_pulls_any(shards):
    """The same for a table: rank 0 has pushed rows of step M when rank 2
    joins and pushes rows at once, before any pull_rows; rank 1 pushes
    step M after that. Step M is the mean of 0 and 1, M + 1 of all
    three (SGD, lr 1, so each row moves by exactly the mean)."""
    servers = shards.start(2, "--mode=bsp", "--elastic")
    ids = np.arange(6, dtype=np.int64)
    a, b = client(servers, "bsp", rank=0), client(servers, "bsp", rank=1)
    for x in (a, b):
        x.declare_embedding("e", 2, num_rows=6, optimizer="sgd", lr=1.0,
                            init_stddev=0.0)
    a.push_rows("e", ids, np.full((6, 2), 2.0, np.float32))
    a.end_step()
    result = {}

    def join():
        try:
            c = client(servers, "bsp")
            c.declare_embedding("e", 2, num_rows=6, optimizer="sgd", lr=1.0,
                                init_stddev=0.0)
            c.push_rows("e", ids, np.full((6, 2), 9.0, np.float32))
            c.end_step()
            result["c"] = c
        except Exception as e:  # noqa: BLE001 (asserted below)
            result["error"] = e

    t = threading.Thread(target=join)
    t.start()
    wait_for(lambda: len(a.members()["live_ranks"]) == 3)
    b.push_rows("e", ids, np.full((6, 2), 4.0, np.float32))
    b.end_step()
    t.join(timeout=60)
    assert "c" in result, result
    c = result["c"]
    np.testing.assert_array_equal(a.pull_rows("e", ids), np.full((6, 2), -3.0))
    for x in (a, b):
        x.push_rows("e", ids, np.full((6, 2), 3.0, np.float32))
        x.end_step()
    for x in (a, b, c):
        np.testing.assert_array_equal(x.pull_rows("e", ids),
                                      np.full((6, 2), -8.0))
        x.leave()


def test_ssp_a_joiner_starts_at_the_slowest_and_holds_no_one(shards):
    servers = shards.start(1, "--mode=ssp", "--staleness=1", "--elastic")
    a, b = client(servers, "ssp", rank=0), client(servers, "ssp", rank=1)
    a.declare({"w": np.zeros(4, np.float32)}, optimizer="sgd", lr=1.0)
    b.attach()
    for _ in range(10):
        for c in (a, b):
            c.push({"w": np.ones(4, np.float32)})
            c.end_step()
            c.pull()
    c = client(servers, "ssp")
    c.attach()
    assert (c.rank, c.clock) == (2, 10)
    # With the joiner at clock 0 this pull (clock 11) would be held.
    a.push({"w": np.ones(4, np.float32)})
    a.end_step()
    np.testing.assert_array_equal(a.pull()["w"], np.full(4, -21.0))
    c.push({"w": np.ones(4, np.float32)})
    c.end_step()
    np.testing.assert_array_equal(c.pull()["w"], np.full(4, -22.0))
    for x in (a, b, c):
        x.leave()


def test_async_a_joiners_first_push_is_applied(shards):
    servers = shards.start(2, "--mode=async", "--elastic")
    a = client(servers, "async", rank=0)
    # Alone so far, but the job starts with 2: half the data, not all.
    m = a.members()
    assert (m["live_ranks"], m["index"], m["size"]) == ([0], 0, 2), m
    a.declare({"w": np.zeros(8, np.float32)}, optimizer="sgd", lr=0.5)
    a.push({"w": np.ones(8, np.float32)})
    started = time.monotonic()
    c = client(servers, "async")
    c.attach()
    done = c.push({"w": np.full(8, 4.0, np.float32)})
    assert done["slices"] == 2 and done["dropped"] == 0, done
    np.testing.assert_array_equal(c.pull()["w"], np.full(8, -2.5))
    # Not a test of speed (docs/ELASTIC.md measures it): that it is seconds.
    assert time.monotonic() - started < 30
    a.leave()
    c.leave()


PSCTL = os.environ.get("ASYNCPS_PSCTL", "tools/psctl")


def ps_worker(servers, mode, rank, log, *extra):
    return subprocess.Popen(
        [PS_WORKER, f"--servers={servers}", f"--rank={rank}",
         "--num_workers=2", f"--mode={mode}", "--epochs=1000000",
         "--max_train_examples=2000", "--batch_size=32", "--log_every=0",
         "--heartbeat_every=200ms", *extra],
        stdout=log, stderr=subprocess.STDOUT)


def stop(procs, logs):
    """Kills what is still running of `procs` and closes `logs`."""
    for p in procs.values():
        if p.poll() is None:
            p.kill()
            p.wait()
    for f in logs.values():
        f.close()


def clocks(servers):
    """{(shard, rank): (clock, live)} as psctl workers prints them."""
    out = subprocess.run([PSCTL, f"--servers={servers}", "workers"],
                         capture_output=True, text=True, check=True).stdout
    seen = {}
    for line in out.splitlines()[1:]:
        shard, rank, clock, live, _ = line.split(",")
        seen[(int(shard), int(rank))] = (int(clock), live == "1")
    return seen


def trains(servers, rank, steps=5):
    """Waits until `rank` is live on shard 0 and has gone `steps` further."""
    wait_for(lambda: clocks(servers).get((0, rank), (0, False))[1], 60)
    first = clocks(servers)[(0, rank)][0]
    wait_for(lambda: clocks(servers)[(0, rank)][0] >= first + steps, 60)


@pytest.mark.parametrize("mode", ["async", "ssp", "bsp", "allreduce"])
def test_ps_workers_join_and_leave_and_the_rest_go_on(shards, tmp_path,
                                                      mode):
    """Real ps_worker processes: ranks 0 and 1 train; a third (--rank=-1)
    joins and trains; rank 1 is SIGTERMed (it leaves after its step, exit
    0) and the joiner SIGKILLed (dropped after --worker_timeout); rank 0
    goes on training alone, and exits 0 at its own SIGTERM. allreduce: the
    ring grows to 3, shrinks to 2 by the vote, and re-forms alone after the
    SIGKILL fails its all-reduce."""
    extra = ["--staleness=2"] if mode == "ssp" else []
    addrs = shards.start(2, f"--mode={mode}", "--elastic",
                         "--worker_timeout=2s", *extra)
    servers = ",".join(addrs)
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in "abc"}
    procs = {"a": ps_worker(servers, mode, 0, logs["a"]),
             "b": ps_worker(servers, mode, 1, logs["b"])}
    try:
        trains(servers, 1)
        procs["c"] = ps_worker(servers, mode, -1, logs["c"])
        trains(servers, 2)
        if mode == "bsp":  # The joiner made no step wait for it, or short.
            stats = json.loads(subprocess.run(
                [PSCTL, f"--servers={servers}", "status", "--json"],
                capture_output=True, text=True, check=True).stdout)
            assert [int(s.get("stepsShort", 0)) for s in stats] == [0, 0]
        procs["b"].send_signal(signal.SIGTERM)
        assert procs["b"].wait(timeout=60) == 0
        if mode == "allreduce":  # The ring of 0 and 2 trains.
            trains(servers, 2)
        procs["c"].kill()
        procs["c"].wait()
        # bsp: the step in progress waits --worker_timeout for it.
        wait_for(lambda: not clocks(servers)[(0, 2)][1], 30)
        trains(servers, 0, steps=10)  # Alone.
        seen = clocks(servers)
        assert {r for (s, r), (_, live) in seen.items() if live} == {0}, seen
        assert {(s, r) for (s, r) in seen} == {(s, r) for s in (0, 1)
                                                for r in (0, 1, 2)}, seen
        procs["a"].send_signal(signal.SIGTERM)
        assert procs["a"].wait(timeout=60) == 0
    finally:
        stop(procs, logs)
    for k in "ab":
        text = (tmp_path / f"{k}.log").read_text()
        assert " done: steps" in text, text[-2000:]
    if mode == "allreduce":
        a = (tmp_path / "a.log").read_text()
        for ring in ("0,1,2", "0,2", "0"):
            assert f"ranks {ring})" in a, a[-3000:]
        assert "rank 1 leaves" in a, a[-3000:]


def done_line(text):
    """The numbers of ps_worker's closing line: {"steps": ..., ...}."""
    m = re.search(r" done: (.*)", text)
    assert m, text[-2000:]
    words = m.group(1).split()
    return dict(zip(words[::2], words[1::2]))


def test_allreduce_a_joiner_ends_with_the_rings_exact_weights(shards,
                                                             tmp_path):
    """Ranks 0 and 1 train 400 steps by all-reduce; a third joins while
    they train. All three end at the same step with the same weights, bit
    for bit: the joiner took the ring's step, weights and optimizer state,
    and every step after was the same mean on each."""
    addrs = shards.start(1, "--mode=allreduce", "--elastic",
                         "--worker_timeout=2s")
    servers = ",".join(addrs)
    logs = {k: open(tmp_path / f"{k}.log", "w") for k in "abc"}
    steps = ["--steps=400", "--optimizer=adam", "--lr=0.001"]
    procs = {"a": ps_worker(servers, "allreduce", 0, logs["a"], *steps),
             "b": ps_worker(servers, "allreduce", 1, logs["b"], *steps)}
    try:
        trains(servers, 1)
        procs["c"] = ps_worker(servers, "allreduce", -1, logs["c"], *steps)
        for p in procs.values():
            assert p.wait(timeout=120) == 0
    finally:
        stop(procs, logs)
    done = {k: done_line((tmp_path / f"{k}.log").read_text()) for k in "abc"}
    assert {d["clock"] for d in done.values()} == {"400"}, done
    assert len({d["weights"] for d in done.values()}) == 1, done
    # The joiner trained in the ring, not after it (its own steps count).
    assert 0 < int(done["c"]["steps"]) < 400, done
    assert "ranks 0,1,2)" in (tmp_path / "a.log").read_text()


def launcher(servers, workers, log, mode):
    return subprocess.Popen(
        [sys.executable, "-m", "asyncps.run", "--elastic", "--servers",
         servers, "--workers", str(workers), "--mode", mode, "--",
         PS_WORKER, "--epochs=1000000", "--max_train_examples=2000",
         "--batch_size=32", "--log_every=0", "--heartbeat_every=200ms"],
        stdout=log, stderr=subprocess.STDOUT)


@pytest.mark.parametrize("mode", ["bsp", "allreduce"])
def test_the_launcher_adds_workers_to_a_running_job_and_takes_them_out(
        shards, tmp_path, mode):
    """A bsp (or allreduce) job of 2 workers (one launcher); a second
    launcher with --elastic --servers adds 2 (ranks 2 and 3, given by the
    servers); its SIGTERM takes them out cleanly (each leaves after its
    step: none is left for --worker_timeout to drop), and the job goes on
    with 2 (allreduce: its ring of 4 back to 2)."""
    addrs = shards.start(2, f"--mode={mode}", "--elastic",
                         "--worker_timeout=30s")
    servers = ",".join(addrs)
    with open(tmp_path / "first.log", "w") as a, \
            open(tmp_path / "second.log", "w") as b:
        first = launcher(servers, 2, a, mode)
        second = None
        try:
            trains(servers, 1)
            second = launcher(servers, 2, b, mode)
            trains(servers, 3)
            trains(servers, 2)
            second.send_signal(signal.SIGTERM)
            second.wait(timeout=60)
            # Within --worker_timeout (30 s): they said they left.
            seen = clocks(servers)
            assert {r for (s, r), (_, live) in seen.items() if live} == \
                {0, 1}, seen
            trains(servers, 0)
        finally:
            for p in (first, second):
                if p is not None and p.poll() is None:
                    p.send_signal(signal.SIGTERM)
                    p.wait(timeout=60)
    log = (tmp_path / "second.log").read_text()
    assert "rank 2 done:" in log and "rank 3 done:" in log, log[-3000:]
    if mode == "allreduce":
        first_log = (tmp_path / "first.log").read_text()
        assert "ranks 0,1,2,3)" in first_log, first_log[-3000:]
