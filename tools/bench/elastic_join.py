#!/usr/bin/python3
"""How long a worker takes to join a running elastic job (docs/ELASTIC.md
"Measured"): 2 shards (ps_server --elastic) and 2 ps_worker processes
training; then --joins times a fresh Python process joins with rank -1
(imports, asyncps.Client, attach, a push of zeros, end_step, a pull) and
leaves. Prints each time from the process's start to its first push
answered (bsp: to the pull after it, once its step is applied), then the
median and range.

  tools/bench/elastic_join.py [--mode async|ssp|bsp] [--joins 10]
                              [--bin DIR]
"""

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.normpath(os.path.join(os.path.dirname(
    os.path.abspath(__file__)), "..", ".."))

JOINER = r"""
import sys, time
t0 = float(sys.argv[3])
import numpy as np
import asyncps
c = asyncps.Client(sys.argv[1].split(","), rank=-1, num_workers=2,
                   mode=sys.argv[2])
c.attach()
c.push({n: np.zeros(s, np.float32) for n, s in c.tensors.items()})
pushed = time.time() - t0
c.end_step()
c.pull()
print(f"{pushed:.3f} {time.time() - t0:.3f}")
c.leave()
"""


def main():
    # A SIGTERM ends the run through its finally: no shard or worker left.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="async", choices=["async", "ssp", "bsp"])
    p.add_argument("--joins", type=int, default=10)
    p.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin"))
    args = p.parse_args()
    sys.path.insert(0, os.path.join(args.bin, "python"))
    from asyncps.cluster import Shards
    env = dict(os.environ, OMP_NUM_THREADS="1",
               PYTHONPATH=os.path.join(args.bin, "python"))
    shards = Shards(os.path.join(args.bin, "server", "ps_server"),
                    mode=args.mode)
    workers = []
    try:
        servers = ",".join(shards.start(2, "--elastic"))
        for rank in (0, 1):
            workers.append(subprocess.Popen(
                [os.path.join(args.bin, "worker", "ps_worker"),
                 f"--servers={servers}", f"--rank={rank}", "--num_workers=2",
                 f"--mode={args.mode}", "--epochs=100000",
                 "--max_train_examples=2000", "--batch_size=32",
                 "--log_every=0"], stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL))
        time.sleep(3)  # The two train before anyone joins.
        pushed, stepped = [], []
        for _ in range(args.joins):
            out = subprocess.run(
                [sys.executable, "-c", JOINER, servers, args.mode,
                 f"{time.time():.6f}"], env=env, capture_output=True,
                text=True, timeout=120)
            if out.returncode != 0:
                raise SystemExit(f"a joiner failed:\n{out.stderr[-2000:]}")
            a, b = (float(x) for x in out.stdout.split())
            pushed.append(a)
            stepped.append(b)
            print(f"first push answered {a:.3f} s, its step pulled {b:.3f} s",
                  flush=True)
    finally:
        for w in workers:
            w.kill()
            w.wait()
        shards.kill()
    print(f"{args.mode}: first push answered, median "
          f"{statistics.median(pushed):.3f} s (range {min(pushed):.3f}-"
          f"{max(pushed):.3f}); its step pulled, median "
          f"{statistics.median(stepped):.3f} s (range {min(stepped):.3f}-"
          f"{max(stepped):.3f}), over {args.joins} joins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
