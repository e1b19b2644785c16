#!/usr/bin/python3
"""Replicated shards, measured (docs/RELIABILITY.md "Replicated shards"):

  throughput  async training with 2 workers through 2 shards, unreplicated
              and as groups of --replicas members (a private etcd), in
              alternating order, --reps times each: each pair's samples/s
              ratio (the sum of the workers' rates) and the spread.
  pause       a worker (the Python client, tools/bench/failover_pusher.py)
              pushes as fast as it can through the groups; --kills times a
              shard's primary is SIGKILLed (shards in turn) and restarted
              at once on its port, as a supervisor would; each kill's pause
              is what the worker saw: from the SIGKILL to the end of its
              first push acknowledged after it (the backup's promotion, the
              client finding it, and with --min_insync 2 in a group of 2
              the restarted member's join). The killed member is a backup
              again before the next kill. p50, p99 and max.

  tools/bench/replica_bench.py [--reps 3] [--kills 50] [--replicas 2]
                               [--what both|throughput|pause]
                               [--bin DIR] [--out DIR] [--epochs 2]
                               [--slowdown 1]

--bin takes ps_server, ps_worker and psctl from DIR instead of building them
(and the Python module from DIR/python, if there, for the pause's worker).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402
from asyncps import cluster  # noqa: E402
from tools.reliability import chaos  # noqa: E402


def parse():
    p = argparse.ArgumentParser(prog="replica_bench.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--reps", type=chaos.positive_int, default=3)
    p.add_argument("--kills", type=chaos.positive_int, default=50)
    p.add_argument("--replicas", type=chaos.positive_int, default=2)
    p.add_argument("--epochs", type=chaos.positive_int, default=2)
    p.add_argument("--slowdown", default="1")
    p.add_argument("--what", choices=("both", "throughput", "pause"),
                   default="both")
    p.add_argument("--bin", default="")
    p.add_argument("--out", default="")
    return p.parse_args()


class Args:
    """What chaos.Job reads of its arguments."""

    def __init__(self, a, out, replicas, epochs, slowdown):
        self.mode, self.shards, self.workers = "async", 2, 2
        self.epochs, self.slowdown, self.seed = epochs, slowdown, 1
        self.checkpoint_every = "off"
        self.replicas = replicas
        self.bin, self.out = a.bin, out


def rate(job):
    """The workers' summed samples/s, from their --result_json."""
    total = 0.0
    for r, w in job.workers.items():
        if w.wait() != 0:
            raise RuntimeError(f"worker {r} failed; see {job.dir}")
        with open(os.path.join(job.dir, f"result{r}.json")) as f:
            total += json.load(f)["samples_per_second"]
    return total


def train(a, name, replicas):
    job = chaos.Job(Args(a, a.out, replicas, a.epochs, a.slowdown), name)
    try:
        for r in range(2):
            job.start_worker(r)
        return rate(job)
    finally:
        job.stop()


def stats(member, psctl):
    """Member `member`'s Stats (its replica part), or None."""
    out = subprocess.run([psctl, f"--servers={member.address}", "--timeout=1s",
                          "status", "--json"], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return json.loads(out.stdout)[0].get("replica", {})


def wait_role(member, role, psctl, limit=60.0):
    until = time.monotonic() + limit
    while time.monotonic() < until:
        s = stats(member, psctl)
        if s is not None and s.get("role") == role:
            return s
        time.sleep(0.02)
    raise RuntimeError(f"{member.address} never became {role}")


def pauses(a):
    """Kills a shard's primary --kills times (the shards in turn) under a
    worker pushing as fast as it can, restarting the killed member at once
    (as Kubernetes or compose would); returns each kill's pause as the
    worker saw it: from the SIGKILL to the end of its first push
    acknowledged after it."""
    psctl = os.path.join(a.bin, "psctl")
    job = chaos.Job(Args(a, a.out, a.replicas, 1, "1"), "pauses")
    out = os.path.join(job.dir, "pushes.txt")
    stop = os.path.join(job.dir, "stop")
    # The child keeps its own copy of the log file; ours closes here.
    with open(os.path.join(job.dir, "pusher.log"), "w") as log:
        # The Python module: DIR/python (built with the binaries), else
        # wherever PYTHONPATH or pip put it.
        env = dict(os.environ)
        module = os.path.join(a.bin, "python")
        if os.path.isdir(os.path.join(module, "asyncps")):
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (module, env.get("PYTHONPATH")) if p)
        pusher = subprocess.Popen(
            [sys.executable, os.path.join(ROOT, "tools", "bench",
                                          "failover_pusher.py"),
             f"--servers={job.servers}", f"--out={out}", f"--stop={stop}"],
            stdout=subprocess.DEVNULL, stderr=log, env=env)
    kills = []
    try:
        time.sleep(2)  # The worker declared and is pushing (a pace).
        for k in range(a.kills):
            group = job.groups[k % 2]
            roles = [stats(m, psctl) or {} for m in group]
            primary = next(i for i, s in enumerate(roles)
                           if s.get("role") == "primary")
            group[primary].kill()
            kills.append(time.monotonic())
            group[primary].start()  # At once, on its port: it rejoins.
            wait_role(group[primary], "backup", psctl)
            time.sleep(0.5)  # The group settles before the next kill.
        with open(stop, "w"):
            pass
        if pusher.wait(timeout=120) != 0:
            raise RuntimeError(f"the pusher failed; see {job.dir}")
    finally:
        if pusher.poll() is None:
            pusher.kill()
        job.stop()
    with open(out) as f:
        pushes = [tuple(float(x) for x in line.split()) for line in f]
    result = []
    for k, t in enumerate(kills):
        ends = [end for start, end, ok in pushes if end > t and ok]
        if not ends:
            raise RuntimeError(f"no push acknowledged after kill {k + 1}")
        result.append(min(ends) - t)
        print(f"  kill {k + 1}: shard {k % 2}'s primary; the worker's next "
              f"push acknowledged after {result[-1] * 1000:.0f} ms",
              flush=True)
    return result


def percentile(values, q):
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))]


def main():
    a = parse()
    if not a.out:
        a.out = tempfile.mkdtemp(prefix="asyncps-replica-bench.")
    if not a.bin:
        subprocess.run(["bazel", "build", "--noshow_progress",
                        "//server:ps_server", "//worker:ps_worker",
                        "//tools:psctl", "//python:asyncps"], cwd=ROOT,
                       check=True, stdout=sys.stderr)
        built = subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT,
                               capture_output=True, text=True,
                               check=True).stdout.strip()
        a.bin = os.path.join(a.out, "bin")
        os.makedirs(a.bin, exist_ok=True)
        for b in ("server/ps_server", "worker/ps_worker", "tools/psctl"):
            target = os.path.join(a.bin, os.path.basename(b))
            if os.path.exists(target):
                os.remove(target)
            subprocess.run(["cp", os.path.join(built, b), target], check=True)
        subprocess.run(["cp", "-rL", os.path.join(built, "python"),
                        a.bin], check=True)
    print(f"== async, 2 shards, 2 workers, {a.epochs} epochs; replicated: "
          f"{a.replicas} members per shard; logs in {a.out}", flush=True)
    ratios = []
    for rep in range(a.reps if a.what != "pause" else 0):
        order = [0, a.replicas] if rep % 2 == 0 else [a.replicas, 0]
        r = {}
        for replicas in order:
            r[replicas] = train(a, f"rep{rep}-r{replicas}", replicas)
        ratios.append(r[a.replicas] / r[0])
        print(f"rep {rep + 1}: unreplicated {r[0]:.0f} samples/s, "
              f"replicated {r[a.replicas]:.0f} samples/s, ratio "
              f"{ratios[-1]:.2f}", flush=True)
    if ratios:
        print(f"throughput ratio replicated/unreplicated: mean "
              f"{statistics.mean(ratios):.2f}, range {min(ratios):.2f}-"
              f"{max(ratios):.2f} over {a.reps} pairs", flush=True)
    if a.what == "throughput":
        return
    p = pauses(a)
    print(f"pause after a primary SIGKILL (restarted at once) over {len(p)} "
          f"kills, as the worker saw it: p50 "
          f"{statistics.median(p) * 1000:.0f} ms, p99 "
          f"{percentile(p, 0.99) * 1000:.0f} ms, max {max(p) * 1000:.0f} ms",
          flush=True)


if __name__ == "__main__":
    main()
