#!/usr/bin/python3
"""A chaos run: the same training job twice on 127.0.0.1, undisturbed and
then with random shards and workers SIGKILLed and restarted (same flags,
same port) every few seconds for a bounded time. Reports each run's test
accuracy and wall time, what was killed, and whether every worker
finished (exit 0). docs/RELIABILITY.md gives measured results.

  tools/reliability/chaos.py [--mode async] [--shards 2] [--workers 2]
                             [--epochs 6] [--slowdown 3] [--seconds 40]
                             [--every 4] [--seed 1] [--seeds A-B]
                             [--baselines N]
                             [--plan s,w,...] [--checkpoint_every 2s]
                             [--replicas N] [--bin DIR] [--out DIR]

--checkpoint_every off runs the shards without checkpoints: a restarted
shard then gets its weights back from a worker's copy. --seeds A-B runs the
undisturbed job once and the chaos run once per seed (the seed picks the
victims; the data order stays --seed's), then a summary line.
--seconds auto kills for 0.8 of the shortest undisturbed run's time, so the
kills fall while the job trains whatever the machine's speed.
--baselines N runs the undisturbed job N times (the same job: only the
scheduling differs) and judges each chaos run by its distance to the
nearest of their accuracies (0 within their range), printing the range. --plan kills
in that order (s: a shard, w: a worker, picked by the seed) every --every
seconds (fractions allowed) until the plan is done. --bin takes ps_server
and ps_worker from DIR instead of building them. Shards are started through
asyncps.cluster (python/package/cluster.py), as everywhere else.

--replicas N runs each shard as a group of N ps_server processes on fixed
ports with a private etcd (docs/DESIGN.md "Replicated shards"); a shard
kill then SIGKILLs one member picked by the seed, primary or backup, and
restarts it (it joins its group again as a backup). Members keep no
checkpoints: their state comes from the group.
"""

import argparse
import os
import random
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402
from asyncps import cluster  # noqa: E402
from tools.progress import Progress  # noqa: E402
from tools.reliability import history_faults  # noqa: E402


def positive_int(text):
    if not re.fullmatch(r"[0-9]+", text) or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, not "
                                         f"'{text}'")
    return int(text)


def seconds_arg(text):
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", text) or float(text) <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of "
                                         f"seconds, not '{text}'")
    return float(text)


def seed_range(text):
    m = re.fullmatch(r"([0-9]+)-([0-9]+)", text)
    if not m or int(m[1]) < 1 or int(m[2]) < int(m[1]):
        raise argparse.ArgumentTypeError(f"must be A-B with 1 <= A <= B, not "
                                         f"'{text}'")
    return int(m[1]), int(m[2])


def plan_arg(text):
    kinds = text.split(",")
    if any(k not in ("s", "w") for k in kinds):
        raise argparse.ArgumentTypeError(
            f"is a comma list of s (shard) and w (worker), not '{text}'")
    return kinds


def parse():
    p = argparse.ArgumentParser(prog="chaos.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="async")
    p.add_argument("--shards", type=positive_int, default=2)
    p.add_argument("--workers", type=positive_int, default=2)
    p.add_argument("--epochs", type=positive_int, default=6)
    p.add_argument("--slowdown", default="3")
    p.add_argument("--seconds", type=lambda t: t if t == "auto"
                   else positive_int(t), default=40)
    p.add_argument("--every", type=seconds_arg, default=4.0)
    p.add_argument("--seed", type=positive_int, default=1)
    p.add_argument("--seeds", type=seed_range, default=None)
    p.add_argument("--baselines", type=positive_int, default=1)
    p.add_argument("--plan", type=plan_arg, default=[])
    p.add_argument("--checkpoint_every", default="2s")
    p.add_argument("--replicas", type=positive_int, default=None)
    p.add_argument("--bin", default="")
    p.add_argument("--out", default="")
    return p.parse_args()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_etcd(directory):
    """A private etcd with elections fast enough for 1 s leases; returns
    (Popen, "127.0.0.1:port"). The members wait for it themselves."""
    argv, endpoint = history_faults.etcd_argv(directory)
    return history_faults.start_etcd(directory, argv), endpoint


class Job:
    """One training run's processes."""

    def __init__(self, args, name):
        self.args, self.name = args, name
        self.dir = os.path.join(args.out, name)
        os.makedirs(self.dir, exist_ok=True)
        self.workers = {}  # rank -> Popen
        self.etcd = None
        flags = ["--host=127.0.0.1", f"--mode={args.mode}",
                 "--worker_timeout=3s"]
        if args.replicas:
            self.start_groups(flags)
            return
        if args.checkpoint_every != "off":
            ckpt = os.path.join(self.dir, "ckpt")
            os.makedirs(ckpt, exist_ok=True)
            flags += [f"--checkpoint_dir={ckpt}",
                      f"--checkpoint_every={args.checkpoint_every}"]
        self.shards = []
        for s in range(args.shards):
            log = open(os.path.join(self.dir, f"server{s}.log"), "a")
            shard = cluster.Shard(os.path.join(args.bin, "ps_server"), s,
                                  args.shards, flags, log, self.dir)
            self.shards.append(shard)
            shard.start()
        self.servers = ",".join(s.address for s in self.shards)

    def start_groups(self, flags):
        """--replicas: etcd, then each shard's members (self.shards lists
        every member; self.groups[s] shard s's)."""
        a = self.args
        self.etcd, endpoint = start_etcd(self.dir)
        self.shards, self.groups = [], []
        for s in range(a.shards):
            group = []
            for m in range(a.replicas):
                port = free_port()
                ready = os.path.join(self.dir, f"member{s}-{m}")
                os.makedirs(ready, exist_ok=True)
                log = open(os.path.join(self.dir, f"server{s}-{m}.log"), "a")
                member = cluster.Shard(
                    os.path.join(a.bin, "ps_server"), s, a.shards,
                    flags + [f"--replicas={a.replicas}", f"--etcd={endpoint}",
                             "--job=chaos", f"--advertise=127.0.0.1:{port}"]
                    + (["--bootstrap"] if m == 0 else []),
                    log, ready)
                member.port = port  # Fixed: the group lists it.
                member.start()
                group.append(member)
                self.shards.append(member)
            self.groups.append(group)
        self.servers = ",".join("|".join(m.address for m in g)
                                for g in self.groups)

    def start_worker(self, rank):
        a = self.args
        # The child keeps its own copies of the files; ours close here.
        with open(os.path.join(self.dir, f"worker{rank}.out"), "a") as out, \
                open(os.path.join(self.dir, f"worker{rank}.log"), "a") as log:
            self.workers[rank] = subprocess.Popen(
                [os.path.join(a.bin, "ps_worker"), f"--servers={self.servers}",
                 f"--rank={rank}", f"--mode={a.mode}",
                 f"--num_workers={a.workers}", f"--epochs={a.epochs}",
                 f"--slowdown={a.slowdown}", f"--seed={a.seed}",
                 "--log_every=2s", "--heartbeat_every=500ms",
                 "--optimizer=sgd", "--lr=0.1",
                 f"--result_json={self.dir}/result{rank}.json"],
                stdout=out, stderr=log)

    def accuracy(self):
        """The servers' weights scored on the test set (the evaluator)."""
        with open(os.path.join(self.dir, "evaluator.log"), "a") as log:
            out = subprocess.run(
                [os.path.join(self.args.bin, "ps_worker"), "--role=evaluator",
                 f"--servers={self.servers}", "--eval_once"],
                stdout=subprocess.PIPE, stderr=log, text=True).stdout
        m = re.search(r"accuracy=([0-9.]+)", out)
        return m[1] if m else "none"

    def stop(self):
        for w in self.workers.values():
            if w.poll() is None:
                w.kill()
            w.wait()
        for s in self.shards:
            s.stop()
        if self.etcd is not None:
            self.etcd.kill()
            self.etcd.wait()


def chaos(job, args, kill_seed, start):
    """Kills and restarts processes; returns (shard kills, worker kills)."""
    rng = random.Random(kill_seed)
    kinds = args.plan
    until = time.monotonic() + args.seconds
    shard_kills = worker_kills = step = 0
    while time.monotonic() < until:
        if kinds and step >= len(kinds):
            break
        time.sleep(args.every)  # The pace of the chaos, not a sync.
        if all(w.poll() is not None for w in job.workers.values()):
            break  # The job is over: nothing left to disturb.
        # Server processes: shards, or every member of every group.
        servers = len(job.shards)
        if kinds:
            victim = (rng.randrange(servers) if kinds[step] == "s"
                      else servers + rng.randrange(args.workers))
        else:
            victim = rng.randrange(servers + args.workers)
        t = int(time.monotonic() - start)
        if victim < servers:
            what = (f"shard {victim}" if not args.replicas else
                    f"member {victim % args.replicas} of shard "
                    f"{victim // args.replicas}")
            print(f"  t={t}s: SIGKILL {what}, restart", file=sys.stderr)
            job.shards[victim].kill()
            job.shards[victim].start()  # Same port.
            shard_kills += 1
        else:
            rank = victim - servers
            if job.workers[rank].poll() is not None:
                continue  # Done already.
            print(f"  t={t}s: SIGKILL worker {rank}, restart",
                  file=sys.stderr)
            job.workers[rank].kill()
            job.workers[rank].wait()
            job.start_worker(rank)
            worker_kills += 1
        step += 1
    return shard_kills, worker_kills


# What a run's logs say when the loss the guarantees allow without
# checkpoints happened (docs/RELIABILITY.md "The guarantees, and their exact
# limits"): a shard restarted while no live worker held a copy of its
# trained weights, so part of the model went back to where a fresh copy
# was. Such a run is reported apart, not as a failure of a guarantee.
NO_COPY_LEFT = ("no worker that pulled its weights restored it",
                "no worker restored it within")


def no_copy_left(directory):
    """The first log line of `directory` that shows a shard restored
    without any trained copy, or None."""
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".log"):
            continue
        with open(os.path.join(directory, name), errors="replace") as f:
            for line in f:
                if any(m in line for m in NO_COPY_LEFT):
                    return f"{name}: {line.strip()[-160:]}"
    return None


def distance(accuracy, bases):
    """How far `accuracy` (a string; "none" if unknown) lies outside the
    range of the undisturbed accuracies `bases` (0 within it); 1 if either
    is unknown."""
    if accuracy == "none" or not bases:
        return 1.0
    a = float(accuracy)
    return max(0.0, min(bases) - a, a - max(bases))


def run(args, name, kill_seed=None):
    """Trains once (with chaos if `kill_seed` is given); prints and returns
    the result: name, accuracy, seconds, kills, failed workers."""
    job = Job(args, name)
    try:
        start = time.monotonic()
        for r in range(args.workers):
            job.start_worker(r)
        shard_kills = worker_kills = 0
        if kill_seed is not None:
            shard_kills, worker_kills = chaos(job, args, kill_seed, start)
        failed = sum(w.wait() != 0 for w in job.workers.values())
        taken = int(time.monotonic() - start)
        acc = job.accuracy()
    finally:
        job.stop()
    kills = shard_kills + worker_kills
    beyond = no_copy_left(job.dir) if kill_seed is not None else None
    print(f"{name} accuracy {acc} seconds {taken} kills {kills} (shards "
          f"{shard_kills}, workers {worker_kills}) failed_workers {failed}"
          + (f" no_copy_left [{beyond}]" if beyond else ""), flush=True)
    return {"accuracy": acc, "kills": kills, "shards": shard_kills,
            "workers": worker_kills, "failed": failed, "beyond": beyond,
            "seconds": taken}


def main():
    args = parse()
    first, last = args.seeds or (args.seed, args.seed)
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="asyncps-chaos.")
    os.makedirs(args.out, exist_ok=True)
    if not args.bin:
        subprocess.run(["bazel", "build", "--noshow_progress",
                        "//server:ps_server", "//worker:ps_worker"],
                       cwd=ROOT, check=True, stdout=sys.stderr)
        built = subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT,
                               capture_output=True, text=True,
                               check=True).stdout.strip()
        args.bin = os.path.join(args.out, "bin")
        os.makedirs(args.bin, exist_ok=True)
        for b in ("server/ps_server", "worker/ps_worker"):
            target = os.path.join(args.bin, os.path.basename(b))
            if os.path.exists(target):
                os.remove(target)
            shutil.copy(os.path.join(built, b), target)
    plan = f", plan {','.join(args.plan)}" if args.plan else ""
    if args.replicas:
        args.checkpoint_every = "off"  # A member's state is its group's.
    groups = f", {args.replicas} members each" if args.replicas else ""
    print(f"== mode {args.mode}, {args.shards} shards{groups}, {args.workers} "
          f"workers, {args.epochs} epochs, slowdown {args.slowdown}, "
          f"checkpoints {args.checkpoint_every}, seeds {first}-{last}{plan}; "
          f"logs in {args.out}", flush=True)
    # The undisturbed job's own spread (scheduling alone): each chaos run
    # is judged by its distance to the nearest of these.
    progress = Progress(total=args.baselines + last - first + 1)

    def tagged(name, **kw):  # Each run with its place and the ETA.
        print(f"== {progress.tag()} {name}", file=sys.stderr, flush=True)
        r = run(args, name, **kw)
        progress.step()
        return r

    bases = [tagged("undisturbed" if args.baselines == 1
                    else f"undisturbed-{k}")
             for k in range(1, args.baselines + 1)]
    base_acc = [float(b["accuracy"]) for b in bases
                if b["accuracy"] != "none" and not b["failed"]]
    if args.seconds == "auto":  # Kills within the job, not after it.
        args.seconds = max(1, int(0.8 * min(b["seconds"] for b in bases)))
        print(f"kills for {args.seconds} s (0.8 of the shortest undisturbed "
              f"run)", flush=True)
    totals = {"kills": 0, "shards": 0, "workers": 0, "failed": 0}
    worst = 0.0
    beyond = []  # (seed, difference) of runs where no copy was left.
    for seed in range(first, last + 1):
        name = "chaos" if first == last else f"chaos-seed{seed}"
        r = tagged(name, kill_seed=seed)
        for k in totals:
            totals[k] += r[k]
        diff = distance(r["accuracy"], base_acc)
        if r["beyond"] and not r["failed"]:
            beyond.append((seed, diff))
        else:
            worst = max(worst, diff)
    replicas = f" replicas {args.replicas}" if args.replicas else ""
    if args.baselines > 1:
        print(f"undisturbed runs {len(base_acc)} of {args.baselines} "
              f"accuracy {min(base_acc, default=0):g} to "
              f"{max(base_acc, default=0):g}")
    print(f"summary mode {args.mode}{replicas} checkpoints "
          f"{args.checkpoint_every} runs "
          f"{last - first + 1} kills {totals['kills']} (shards "
          f"{totals['shards']}, workers {totals['workers']}) failed_workers "
          f"{totals['failed']} max_accuracy_difference {worst:g}"
          + (" no_copy_left " + ",".join(f"seed{k}:{d:g}" for k, d in beyond)
             if beyond else ""))


if __name__ == "__main__":
    main()
