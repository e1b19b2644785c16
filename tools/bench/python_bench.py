#!/usr/bin/python3
"""The PyTorch benchmark of docs/PYTHON.md: the Fashion-MNIST CNN example
(python/examples/fashion_cnn.py) with two workers through the launcher
(python3 -m asyncps.run, two shards) in async and bsp, and under PyTorch's
DistributedDataParallel with two processes (gloo), in the same run, a few
times. Reports per run and mode: samples/s per worker and its ratio to
DDP's (rank 0's, which the scoring does not slow), the wrapper's own share of the training time, the final test
accuracy (rank 0's model on all 10,000 test images), and the seconds of
training until the curve (the first 2,000 test images, scored every 100
steps outside the timed loop) first reached --target; draws the curves of
the first run (gnuplot) to OUT/curves.png.

    tools/bench/python_bench.py --out out/pybench [--runs 3] [--epochs 4]
"""

import argparse
import csv
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402

EXAMPLE = os.path.join(ROOT, "python", "examples", "fashion_cnn.py")
PY = "/usr/bin/python3"


def run_job(name, args, out, epochs, extra):
    """One training job; returns its parsed results."""
    curve = os.path.join(out, f"{name}.csv")
    common = [f"--epochs={epochs}", "--log_every=0", f"--curve={curve}",
              *extra]
    if name.startswith("ddp"):
        port = str(29500 + os.getpid() % 1000)
        procs = [subprocess.Popen(
            [PY, EXAMPLE, "--ddp", f"--port={port}", f"--rank={r}",
             "--num_workers=2", *common], stdout=subprocess.PIPE, text=True)
            for r in range(2)]
        text = "".join(p.communicate()[0] for p in procs)
        if any(p.returncode for p in procs):
            raise SystemExit(f"{name} failed:\n{text}")
    else:
        done = subprocess.run(
            [PY, "-m", "asyncps.run", "--shards", "2", "--workers", "2",
             "--mode", args.split(":")[0], "--ps_server", ARGS.ps_server,
             "--", EXAMPLE, *common], capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"{name} failed:\n{done.stdout}{done.stderr}")
        text = done.stdout
    found = sorted((int(r), float(v)) for r, v in
                   re.findall(r"done: rank (\d+) samples \d+ samples/s (\d+)", text))
    rates = [v for _, v in found]  # By rank.
    wrapper = [float(v) for v in re.findall(r"wrapper_fraction ([\d.]+)",
                                            text)]
    acc = float(re.findall(r"test_accuracy ([\d.]+)", text)[0])
    with open(curve) as f:
        points = [(float(r["seconds"]), float(r["test_accuracy"]))
                  for r in csv.DictReader(f)]
    reached = next((t for t, a in points if a >= ARGS.target), None)
    return {"rates": rates, "wrapper": max(wrapper) if wrapper else None,
            "accuracy": acc, "to_target": reached, "curve": curve}


def main():
    global ARGS
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--target", type=float, default=0.87)
    p.add_argument("--ps_server", default=os.path.join(
        ROOT, "bazel-bin", "server", "ps_server"))
    p.add_argument("--async_args", default="--lr=0.1 --momentum=0.5",
                   help="async's hyper-parameters (the others: defaults)")
    ARGS = p.parse_args()
    os.makedirs(ARGS.out, exist_ok=True)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ["PYTHONPATH"] = os.path.join(ROOT, "bazel-bin", "python")
    jobs = [("async", "async", ARGS.async_args.split()),
            ("bsp", "bsp", []), ("ddp", "ddp", [])]
    results = {name: [] for name, _, _ in jobs}
    for run in range(1, ARGS.runs + 1):
        for name, mode, extra in jobs:
            r = run_job(f"{name}{run}", mode, ARGS.out, ARGS.epochs, extra)
            results[name].append(r)
            print(f"run {run} {name}: samples/s {r['rates']} accuracy "
                  f"{r['accuracy']} to {ARGS.target}: {r['to_target']} s "
                  f"wrapper {r['wrapper']}", flush=True)
    print(f"\n| run | mode | samples/s (rank 0, rank 1) | rank 0 / DDP's | wrapper's share "
          f"| test accuracy | seconds to {ARGS.target} |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for run in range(ARGS.runs):
        # Rank 0's rate: it scores the curve outside its timed loop, but
        # in bsp and DDP rank 1 waits for it meanwhile and counts the wait.
        ddp = results["ddp"][run]["rates"][0]
        for name, _, _ in jobs:
            r = results[name][run]
            rate = r["rates"][0]
            share = "" if r["wrapper"] is None else f"{100 * r['wrapper']:.1f} %"
            print(f"| {run + 1} | {name} | "
                  f"{', '.join(f'{x:.0f}' for x in r['rates'])} | "
                  f"{rate / ddp:.2f} | {share} | {r['accuracy']:.4f} | "
                  f"{r['to_target'] if r['to_target'] is not None else 'not reached'} |")
    script = (f"set terminal pngcairo size 900,560; set output "
              f"'{ARGS.out}/curves.png'; set datafile separator ',';"
              f"set key bottom right; set xlabel 'seconds of training';"
              f"set ylabel 'test accuracy (2,000 images)'; set grid; plot " +
              ", ".join(f"'{results[n][0]['curve']}' using 1:3 with lines "
                        f"lw 2 title '{n}'" for n, _, _ in jobs))
    subprocess.run(["gnuplot", "-e", script], check=False)
    print(f"\ncurves of run 1: {ARGS.out}/curves.png")


if __name__ == "__main__":
    main()
