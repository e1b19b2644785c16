#!/usr/bin/env python3
"""Runs a grid of asyncps training runs and reports how the modes compare.

Each run starts a clean cluster on 127.0.0.1 (shards, an evaluator, the
workers), trains the MLP on Fashion-MNIST for a fixed budget of samples
summed over all workers, and stops everything. Grid: links x compressions x
modes x worker counts x straggler profiles x seeds. A link other than
loopback (--links 1gbit) puts each shard, the evaluator and each worker on
an emulated host of its own (deploy/netem_cluster.sh: network namespaces,
tbf-shaped links of that rate each way; root only), removed after the run.

Outputs in --out:
  runs/<run>.csv      the evaluator's curve plus samples seen, throughput and
                      staleness of that run
  runs/<run>.log      its processes' stderr
  summary.csv         one row per run
  *.png               gnuplot plots: test accuracy against wall time and
                      against samples seen (one line per mode), with several
                      links one figure with a panel per link, staleness
                      histograms
  report.md           the tables and plots

  tools/experiments/experiment.py --modes async,ssp,bsp,allreduce \\
      --workers 1,2,4 --profiles none,slow:4 --seeds 1 --samples 600000 \\
      --out out/exp
"""

import argparse
import csv
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402
# One run (experiment_run) and the report of them all (experiment_report).
from tools.experiments.experiment_report import plot, report  # noqa: E402
from tools.experiments.experiment_run import (  # noqa: E402
    compatible, fail, run_label, run_one, variant_flags)
from tools.progress import Progress  # noqa: E402


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="async,ssp,bsp,allreduce",
                   help="modes, each optionally with a variant: MODE+bf16, "
                        "MODE+f16 (--wire_dtype), async+prefetch, "
                        "async+layered (--exchange), bsp+backupN "
                        "(--backup_workers=N on the servers), MODE+grpc "
                        "(--transport=grpc), async+scale, ssp+scale "
                        "(--stale_policy=scale on the servers), async+dc, "
                        "async+dca (DC-ASGD, fixed or adaptive lambda 0.04), "
                        "async+diloco, ssp+diloco, bsp+diloco, async+easgd "
                        "(outer optimizers, 8 local steps; +diloco16: 16), "
                        "async+dylu (diloco, dynamic local updates)")
    p.add_argument("--links", default="loopback",
                   help="loopback, or tc rates (1gbit, 100mbit): emulated "
                        "hosts with links of that rate")
    p.add_argument("--compress", default="none",
                   help="workers' --compress values: none, bf16, "
                        "topk:RATIO, onebit (docs/COMPRESSION.md)")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--profiles", default="none,slow:4",
                   help="none, or slow:F (the last worker runs F times slower)")
    p.add_argument("--seeds", default="1")
    p.add_argument("--samples", type=int, default=600000,
                   help="training samples per run, summed over workers")
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--staleness", type=int, default=2, help="ssp bound")
    p.add_argument("--eval_every", default="2s")
    p.add_argument("--out", required=True)
    p.add_argument("--bin", default="",
                   help="folder with ps_server, ps_worker, psctl (default: build)")
    p.add_argument("--worker_flags", default="",
                   help="extra flags for every worker, space-separated")
    p.add_argument("--eval_flags", default="",
                   help="extra flags for the evaluator, space-separated")
    p.add_argument("--run_timeout", type=float, default=1800)
    p.add_argument("--checkpoint_every", default="",
                   help="shards checkpoint this often (e.g. 30s) into "
                        "OUT/<run>.ckpt/; default: no checkpoints, which "
                        "would add their own cost to the timings")
    return p.parse_args()


def build(out):
    subprocess.run([os.path.join(ROOT, "deploy/install_deps.sh")], check=True)
    subprocess.run(["bazel", "build", "//server:ps_server", "//worker:ps_worker",
                    "//tools:psctl"], cwd=ROOT, check=True)
    bindir = os.path.join(out, "bin")
    os.makedirs(bindir, exist_ok=True)
    for rel in ("server/ps_server", "worker/ps_worker", "tools/psctl"):
        dst = os.path.join(bindir, os.path.basename(rel))
        if os.path.exists(dst):
            os.remove(dst)
        shutil.copy(os.path.join(ROOT, "bazel-bin", rel), dst)
    subprocess.run(["bazel", "shutdown"], cwd=ROOT)
    return bindir


def main():
    args = parse_args()
    out = os.path.abspath(args.out)
    rundir = os.path.join(out, "runs")
    os.makedirs(rundir, exist_ok=True)
    bindir = os.path.abspath(args.bin) if args.bin else build(out)
    for b in ("ps_server", "ps_worker", "psctl"):
        if not os.access(os.path.join(bindir, b), os.X_OK):
            fail("no %s in %s" % (b, bindir))
    summary = []
    failed = []  # (label, workers, profile, seed, why): not in summary.
    grid = []  # (seed, workers, profile, link, compress, mode), run order.
    for seed in [int(s) for s in args.seeds.split(",")]:
        for workers in [int(w) for w in args.workers.split(",")]:
            for profile in args.profiles.split(","):
                if profile != "none" and not re.fullmatch(r"slow:[0-9.]+", profile):
                    fail("bad profile %r (want none or slow:F)" % profile)
                for link in args.links.split(","):
                    for compress in args.compress.split(","):
                        for mode in args.modes.split(","):
                            variant_flags(mode)  # Fails early on a bad entry.
                            grid.append((seed, workers, profile, link,
                                         compress, mode))
    progress = Progress(total=len(grid))
    for seed, workers, profile, link, compress, mode in grid:
        label = run_label(mode, compress, link)
        if not compatible(mode, compress):
            print("== %s: skipped (ps_worker refuses this pair)" % label,
                  flush=True)
            progress.total -= 1
            continue
        print("== %s %s, %d workers, %s, seed %d" %
              (progress.tag(), label, workers, profile, seed), flush=True)
        try:
            r = run_one(args, bindir, mode, workers, profile, seed, rundir,
                        compress, link)
        except RuntimeError as e:  # A worker failed.
            print("   FAILED: %s" % e, flush=True)
            failed.append((label, workers, profile, seed, str(e)[-300:]))
            continue
        finally:
            progress.step()
        print("   final accuracy %s, %s samples/s, staleness %s, %s s, 0.85 "
              "at %s s" % (r["final_accuracy"], r["samples_per_s"],
                           r["mean_staleness"], r["wall_s"],
                           r["time_to_0.85"] or "-"), flush=True)
        summary.append(r)
    if not summary:
        fail("every run failed: %s" % failed[-1][-1])
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        w.writeheader()
        w.writerows(summary)
    pngs = plot(args, out, summary)
    report(args, out, summary, pngs, failed)
    print("== report: %s" % os.path.join(out, "report.md"))


if __name__ == "__main__":
    main()
