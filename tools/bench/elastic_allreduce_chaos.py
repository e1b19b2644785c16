#!/usr/bin/python3
"""Chaos for elastic allreduce (docs/ELASTIC.md): one shard (ps_server
--elastic --mode=allreduce) and ranks 0 and 1 training --steps steps by
all-reduce; meanwhile, at seeded random moments, ps_workers join with
--rank=-1 (at most two at a time) and are SIGTERMed or SIGKILLed. The
run passes when every rank still in the job at the end (0, 1 and the
joiners alive) exits 0 at the same clock, --steps, with the same
weights bit for bit (the closing line's checksum), and every SIGTERMed
joiner exits 0. Prints one line per seed and the totals.

  tools/bench/elastic_allreduce_chaos.py [--seeds 1-10] [--steps 600]
                                         [--bin DIR]
"""

import argparse
import json
import os
import random
import re
import signal
import subprocess
import tempfile
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", ".."))


def seeds_of(text):
    lo, _, hi = text.partition("-")
    return range(int(lo), int(hi or lo) + 1)


def done_line(path):
    """{"clock": ..., "weights": ...} of ps_worker's closing line, or None."""
    with open(path) as f:
        m = re.search(r" done: (.*)", f.read())
    if not m:
        return None
    words = m.group(1).split()
    return dict(zip(words[::2], words[1::2]))


def judge(procs, killed, termed, steps):
    """What is wrong with a finished seed (every process exited): a rank
    not killed that did not exit 0 or print its closing line, and the
    ranks left at the end (not SIGTERMed) apart in clock or weights.
    Returns the problems and how many ranks were left."""
    problems = []
    finals = {}
    for name, (p, log) in procs.items():
        if name in killed:
            continue
        if p.returncode != 0:
            problems.append(f"{name} exited {p.returncode}")
            continue
        d = done_line(log)
        if d is None:
            problems.append(f"{name} printed no closing line")
        elif name not in termed:
            finals[name] = d
    clocks = {d["clock"] for d in finals.values()}
    weights = {d["weights"] for d in finals.values()}
    if clocks != {str(steps)}:
        problems.append(f"clocks {sorted(clocks)}")
    if len(weights) != 1:
        problems.append(f"weights differ: {finals}")
    return problems, len(finals)


def run(seed, steps, bins, work):
    """One seed; returns (ok, what happened)."""
    rng = random.Random(seed)
    ready = os.path.join(work, "ready.json")
    server = subprocess.Popen(
        [bins["server"], "--port=0", f"--ready_file={ready}",
         "--mode=allreduce", "--elastic", "--num_workers=2",
         "--worker_timeout=2s"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = {}  # name: (process, log path)
    try:
        while not os.path.exists(ready) or not os.path.getsize(ready):
            time.sleep(0.05)
        port = json.load(open(ready))["port"]

        def start(name, rank):
            log = os.path.join(work, f"{name}.log")
            procs[name] = (subprocess.Popen(
                [bins["worker"], f"--servers=127.0.0.1:{port}",
                 f"--rank={rank}", "--num_workers=2", "--mode=allreduce",
                 f"--steps={steps}", "--epochs=1000000",
                 "--max_train_examples=2000",
                 "--batch_size=32", "--log_every=1h",
                 "--heartbeat_every=200ms", "--optimizer=adam",
                 "--lr=0.001"],
                stdout=open(log, "w"), stderr=subprocess.STDOUT), log)

        start("r0", 0)
        start("r1", 1)
        events, termed, killed = [], [], []
        joiners = 0
        while procs["r0"][0].poll() is None:
            time.sleep(rng.uniform(0.5, 2.0))
            if procs["r0"][0].poll() is not None:
                break
            alive = [n for n in procs if n.startswith("j")
                     and procs[n][0].poll() is None]
            if len(alive) < 2 and rng.random() < 0.6:
                joiners += 1
                start(f"j{joiners}", -1)
                events.append(f"+j{joiners}")
            elif alive:
                victim = rng.choice(alive)
                if rng.random() < 0.5:
                    procs[victim][0].send_signal(signal.SIGTERM)
                    termed.append(victim)
                    events.append(f"TERM {victim}")
                else:
                    procs[victim][0].kill()
                    killed.append(victim)
                    events.append(f"KILL {victim}")
        for name, (p, _) in procs.items():
            try:
                p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                return False, f"{name} still running; " + " ".join(events)
        problems, finals = judge(procs, killed, termed, steps)
        what = (f"{len(events)} events ({' '.join(events)}); "
                f"{finals} ranks at the end")
        return not problems, what + ("; " + "; ".join(problems)
                                     if problems else "")
    finally:
        for p, _ in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        server.kill()
        server.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1-10")
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"))
    args = ap.parse_args()
    bins = {"server": os.path.join(args.bin, "server", "ps_server"),
            "worker": os.path.join(args.bin, "worker", "ps_worker")}
    passed = failed = 0
    for seed in seeds_of(args.seeds):
        with tempfile.TemporaryDirectory(prefix="ar_chaos.") as work:
            start = time.time()
            ok, what = run(seed, args.steps, bins, work)
        passed += ok
        failed += not ok
        print(f"seed {seed}: {'pass' if ok else 'FAIL'} in "
              f"{time.time() - start:.0f} s: {what}", flush=True)
    print(f"{passed} passed, {failed} failed")


if __name__ == "__main__":
    main()
