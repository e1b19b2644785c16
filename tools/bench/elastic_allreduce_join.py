#!/usr/bin/python3
"""How long an elastic allreduce ring takes to change (docs/ELASTIC.md
"Measured"): one shard (ps_server --elastic --mode=allreduce) and two
ps_worker ranks training by all-reduce; then --joins times a third
ps_worker starts with --rank=-1 and, once in the ring, is SIGTERMed (or
SIGKILLed, --kill). Prints for each: the join, from the process's start
to its first ring (its log's "goes on from rank"), and the leave, from
the signal to rank 0's "the ring re-formed" (SIGTERM: the vote's step,
then the new ring; SIGKILL: the failed step, --worker_timeout (2 s) until
shard 0 drops the rank, then the new ring); then the median and range of
each.

  tools/bench/elastic_allreduce_join.py [--joins 5] [--kill] [--bin DIR]
"""

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import tempfile
import threading
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", ".."))


def follow(proc, lines):
    """Puts each line `proc` prints on `lines` with the time it came."""
    for line in proc.stdout:
        lines.put((time.time(), line))


def wait_for(lines, text, timeout=60.0):
    """The time of the first line holding `text` (others are dropped)."""
    end = time.time() + timeout
    while True:
        t, line = lines.get(timeout=max(0.1, end - time.time()))
        if text in line:
            return t


def worker(binary, port, rank):
    return subprocess.Popen(
        [binary, f"--servers=127.0.0.1:{port}", f"--rank={rank}",
         "--num_workers=2", "--mode=allreduce", "--epochs=1000000",
         "--max_train_examples=2000", "--batch_size=32", "--log_every=1h",
         "--heartbeat_every=200ms"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--joins", type=int, default=5)
    ap.add_argument("--kill", action="store_true",
                    help="SIGKILL the joiner instead of SIGTERM")
    ap.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"))
    args = ap.parse_args()
    server_bin = os.path.join(args.bin, "server", "ps_server")
    worker_bin = os.path.join(args.bin, "worker", "ps_worker")
    work = tempfile.mkdtemp(prefix="elastic_allreduce_join.")
    ready = os.path.join(work, "ready.json")
    procs = []
    try:
        server = subprocess.Popen(
            [server_bin, "--port=0", f"--ready_file={ready}",
             "--mode=allreduce", "--elastic", "--num_workers=2",
             "--worker_timeout=2s"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        procs.append(server)
        while not os.path.exists(ready) or not os.path.getsize(ready):
            time.sleep(0.05)
        port = json.load(open(ready))["port"]
        zero = queue.Queue()
        for rank in (0, 1):
            p = worker(worker_bin, port, rank)
            procs.append(p)
            threading.Thread(target=follow, args=(p, zero if rank == 0
                                                  else queue.Queue()),
                             daemon=True).start()
        wait_for(zero, "ring generation 1 has ranks 0,1")
        joins, leaves = [], []
        for k in range(args.joins):
            start = time.time()
            p = worker(worker_bin, port, -1)
            procs.append(p)
            mine = queue.Queue()
            threading.Thread(target=follow, args=(p, mine),
                             daemon=True).start()
            joined = wait_for(mine, "goes on from rank")
            time.sleep(1.0)  # It trains in the ring of three for a while.
            while not zero.empty():
                zero.get()
            stop = time.time()
            p.send_signal(signal.SIGKILL if args.kill else signal.SIGTERM)
            reformed = wait_for(zero, "the ring re-formed")
            p.wait(timeout=60)
            joins.append(joined - start)
            leaves.append(reformed - stop)
            print(f"join {k + 1}: {joins[-1]:.2f} s in the ring, "
                  f"leave: {leaves[-1]:.2f} s to the ring of two", flush=True)
        for name, xs in (("join", joins), ("leave", leaves)):
            print(f"{name}: median {statistics.median(xs):.2f} s "
                  f"(range {min(xs):.2f}-{max(xs):.2f} s) over {len(xs)}")
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.kill()
                p.wait()


if __name__ == "__main__":
    main()
