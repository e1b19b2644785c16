#!/usr/bin/python3
"""The elastic experiment of docs/EXPERIMENTS.md (issue #41): the CNN
example (python/examples/fashion_cnn.py) trained by a job whose worker
count goes 2 -> 4 -> 2 while it trains, against the same job at a fixed 2.

  tools/experiments/elastic_experiment.py [--mode async|bsp] [--epochs E]
      [--seeds 1,2,3] [--add_at STEPS] [--joiner_steps STEPS] [--out DIR]
      [--bin DIR]

Per seed: the fixed run (2 shards, 2 workers through asyncps.run, E
epochs); then the elastic one (2 shards with --elastic, the same 2 workers,
and a second launcher adding 2 workers once rank 0 has done --add_at steps,
SIGTERMed once both have trained --joiner_steps steps (psctl workers says);
they leave after their step). The
result is rank 0's test accuracy on the 10,000 test images (its model
after its last pull), the samples every worker trained on (summed: the
data the job saw, some examples twice, some not in the epochs the size
changed: docs/ELASTIC.md "Data"), and the wall time. Writes result.json
and a table (markdown) under --out; --bin takes ps_server from DIR (else
bazel-bin).
"""

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
EXAMPLE = os.path.join(ROOT, "python", "examples", "fashion_cnn.py")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="async", choices=["async", "ssp", "bsp"])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--add_at", type=int, default=300)
    p.add_argument("--joiner_steps", type=int, default=400)
    p.add_argument("--out", default="/tmp/elastic-experiment")
    p.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"))
    a = p.parse_args(argv)
    try:
        a.seed_list = [int(s) for s in a.seeds.split(",")]
    except ValueError:
        p.error(f"--seeds: a comma list of integers, not '{a.seeds}'")
    if a.add_at < 1 or a.joiner_steps < 1:
        p.error("--add_at and --joiner_steps are steps, at least 1")
    return a


def clocks(args, servers):
    """{rank: clock} on shard 0, as psctl workers prints them."""
    out = subprocess.run(
        [os.path.join(args.bin, "tools", "psctl"), f"--servers={servers}",
         "workers"], capture_output=True, text=True).stdout
    seen = {}
    for line in out.splitlines()[1:]:
        shard, rank, clock, live, _ = line.split(",")
        if shard == "0" and live == "1":
            seen[int(rank)] = int(clock)
    return seen


def wait_until(what, proc, poll=0.5):
    """Polls `what()` until true; False if `proc` ended first."""
    while not what():
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    return True


def launcher(args, servers, workers, epochs, seed, log, elastic):
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(args.bin, "python"))
    return subprocess.Popen(
        [sys.executable, "-m", "asyncps.run", "--servers", servers,
         "--workers", str(workers), "--mode", args.mode,
         *(["--elastic"] if elastic else []), "--", EXAMPLE,
         "--epochs", str(epochs), "--seed", str(seed), "--log_every", "0"],
        stdout=log, stderr=subprocess.STDOUT, env=env)


def result(texts, seconds):
    """Rank 0's test accuracy and every worker's samples, from the logs."""
    text = "\n".join(texts)
    acc = re.findall(r"^test_accuracy ([0-9.]+)", text, re.M)
    samples = [int(n) for n in re.findall(r"^done: rank \d+ samples (\d+)",
                                         text, re.M)]
    return {"test_accuracy": float(acc[-1]) if acc else None,
            "samples": sum(samples), "workers_done": len(samples),
            "seconds": round(seconds, 1)}


def run(args, seed, elastic):
    sys.path.insert(0, os.path.join(args.bin, "python"))
    from asyncps.cluster import Shards
    name = f"{'elastic' if elastic else 'fixed'}-{seed}"
    logs = [os.path.join(args.out, f"{name}-{k}.log") for k in "ab"]
    os.makedirs(os.path.join(args.out, name), exist_ok=True)
    shards = Shards(os.path.join(args.bin, "server", "ps_server"),
                    mode=args.mode, log_dir=os.path.join(args.out, name))
    procs = []
    try:
        flags = ["--elastic", "--worker_timeout=5s"] if elastic else []
        servers = ",".join(shards.start(2, *flags))
        start = time.monotonic()
        with open(logs[0], "w") as a, open(logs[1], "w") as b:
            procs.append(launcher(args, servers, 2, args.epochs, seed, a,
                                  elastic))
            if elastic and wait_until(
                    lambda: clocks(args, servers).get(0, 0) >= args.add_at,
                    procs[0]):
                procs.append(launcher(args, servers, 2, 1000, seed + 100, b,
                                      True))
                first = {}

                def trained():
                    now = clocks(args, servers)
                    for r in (2, 3):
                        if r in now:
                            first.setdefault(r, now[r])
                    return len(first) == 2 and all(
                        now.get(r, 0) - first[r] >= args.joiner_steps
                        for r in first)
                wait_until(trained, procs[0])
                procs[1].send_signal(signal.SIGTERM)
                procs[1].wait(timeout=120)
            if procs[0].wait() != 0:
                raise SystemExit(f"{name}: the launcher failed; see {logs[0]}")
        seconds = time.monotonic() - start
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shards.kill()
    texts = [open(f).read() for f in logs if os.path.exists(f)]
    return result(texts, seconds)


def main(argv=None):
    args = parse(argv)
    # A SIGTERM ends the run through its finally: no shard or worker left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    os.makedirs(args.out, exist_ok=True)
    rows = []
    for seed in args.seed_list:
        fixed = run(args, seed, elastic=False)
        print(f"seed {seed} fixed 2: {fixed}", flush=True)
        elastic = run(args, seed, elastic=True)
        print(f"seed {seed} elastic 2-4-2: {elastic}", flush=True)
        rows.append({"seed": seed, "fixed": fixed, "elastic": elastic})
    with open(os.path.join(args.out, "result.json"), "w") as f:
        json.dump({"mode": args.mode, "epochs": args.epochs,
                   "add_at": args.add_at, "joiner_steps": args.joiner_steps,
                   "runs": rows}, f, indent=1)
    print("\n| seed | fixed 2: accuracy, samples, s | 2 -> 4 -> 2: "
          "accuracy, samples, s |\n| --- | --- | --- |")
    for r in rows:
        f, e = r["fixed"], r["elastic"]
        print(f"| {r['seed']} | {f['test_accuracy']}, {f['samples']}, "
              f"{f['seconds']} | {e['test_accuracy']}, {e['samples']}, "
              f"{e['seconds']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
