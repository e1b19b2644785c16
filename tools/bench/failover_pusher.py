#!/usr/bin/python3
"""The worker replica_bench.py's pause measure watches: one async worker
(the Python client) pushing a small model spread over every shard, as fast
as it can, until --seconds pass or the file --stop appears. Each push's
start and end (time.monotonic(), the system's one clock) go to --out as
lines "start end ok", written at the end; so the pause a kill causes is
read as the worker saw it: from the kill to its next acknowledged push.

  failover_pusher.py --servers LIST --out FILE --stop FILE [--seconds 600]
"""

import argparse
import os
import time

import asyncps
import numpy as np

TENSORS, ELEMS = 4, 4096  # 16 slices of 1024: every shard holds some.


def main():
    p = argparse.ArgumentParser(prog="failover_pusher.py")
    p.add_argument("--servers", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--stop", required=True)
    p.add_argument("--seconds", type=float, default=600.0)
    a = p.parse_args()
    client = asyncps.Client(a.servers, rank=0, num_workers=1, mode="async",
                            retry_for=60.0, heartbeat=0.5)
    names = [f"t{t}" for t in range(TENSORS)]
    client.declare({n: np.zeros(ELEMS, np.float32) for n in names},
                   optimizer="sgd", lr=1.0, momentum=0.0)
    grads = {n: np.zeros(ELEMS, np.float32) for n in names}
    pushes = []
    until = time.monotonic() + a.seconds
    while time.monotonic() < until and not os.path.exists(a.stop):
        start = time.monotonic()
        try:
            client.push(grads)
            ok = 1
        except Exception:  # A failed push is a pause too; it is counted.
            ok = 0
        pushes.append((start, time.monotonic(), ok))
    with open(a.out, "w") as f:
        for start, end, ok in pushes:
            f.write(f"{start:.6f} {end:.6f} {ok}\n")
    client.leave()


if __name__ == "__main__":
    main()
