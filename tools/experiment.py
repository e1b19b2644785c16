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

  tools/experiment.py --modes async,ssp,bsp,allreduce --workers 1,2,4 \\
      --profiles none,slow:4 --seeds 1 --samples 600000 --out out/exp
"""

import argparse
import csv
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SYNC_MODES = ("bsp", "allreduce")


def _load_cluster():
    """asyncps.cluster, the shards' launcher the package and its tests use,
    by path (it needs only the standard library, not the compiled module)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "asyncps_cluster", os.path.join(ROOT, "python", "package", "cluster.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


asyncps_cluster = _load_cluster()


def parse_args():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="async,ssp,bsp,allreduce",
                   help="modes, each optionally with a variant: MODE+bf16, "
                        "MODE+f16 (--wire_dtype), async+prefetch, "
                        "async+layered (--exchange), bsp+backupN "
                        "(--backup_workers=N on the servers), MODE+grpc "
                        "(--transport=grpc), async+scale, ssp+scale "
                        "(--stale_policy=scale on the servers)")
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


def fail(msg):
    print("experiment: " + msg, file=sys.stderr)
    sys.exit(1)


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


class Cluster:
    """The processes of one run; all killed on exit."""

    def __init__(self, log):
        self.procs = []
        self.log = log
        self.shards = None  # asyncps_cluster.Shards, stopped last.

    def start(self, argv, stdout=subprocess.PIPE):
        p = subprocess.Popen(argv, stdout=stdout, stderr=self.log, text=True,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if self.shards is not None:
            self.shards.stop()


def variant_flags(label):
    """(mode, worker flags, server flags) of a --modes entry."""
    mode, _, variant = label.partition("+")
    if mode not in ("async", "ssp", "bsp", "allreduce"):
        fail("unknown mode %r" % mode)
    if not variant:
        return mode, [], []
    if variant in ("bf16", "f16"):
        return mode, ["--wire_dtype=" + variant], []
    if variant in ("prefetch", "layered", "fused") and mode == "async":
        return mode, ["--exchange=" + variant], []
    if variant == "grpc" and mode != "allreduce":
        return mode, ["--transport=grpc"], []
    if variant == "scale" and mode in ("async", "ssp"):
        return mode, [], ["--stale_policy=scale"]
    m = re.fullmatch(r"backup([0-9]+)", variant)
    if m and mode == "bsp":
        return mode, [], ["--backup_workers=" + m.group(1)]
    fail("unknown variant %r of %s" % (variant, mode))


NETEM = os.path.join(ROOT, "deploy", "netem_cluster.sh")


def compatible(mode_label, compress):
    """False for a (mode, compression) pair that ps_worker refuses: the
    allreduce ring compresses to f16 only (Horovod's), and f16 compression
    is the ring's, not the servers'. A 16-bit wire (+bf16, +f16) already
    sends gradients in 16 bits: it is run without compression. A grid
    crossing --modes with --compress skips the other pairs."""
    mode, _, variant = mode_label.partition("+")
    if mode == "allreduce":
        return compress in ("none", "f16")
    if variant in ("bf16", "f16"):
        return compress == "none"
    return compress != "f16"


def run_label(mode, compress, link):
    """The run's name in tables and plots: MODE[+variant][ compress][ @link]."""
    label = mode
    if compress != "none":
        label += " " + compress
    if link != "loopback":
        label += " @" + link
    return label


def run_one(args, bindir, mode_label, workers, profile, seed, rundir,
            compress="none", link="loopback"):
    mode, variant_worker_flags, variant_server_flags = variant_flags(mode_label)
    label = run_label(mode_label, compress, link)
    if compress != "none":
        variant_worker_flags = variant_worker_flags + ["--compress=" + compress]
    name = "%s-w%d-%s-s%d" % (re.sub(r"[^A-Za-z0-9.]+", "_", label), workers,
                              profile.replace(":", ""), seed)
    log = open(os.path.join(rundir, name + ".log"), "w")
    cluster = Cluster(log)
    # Emulated hosts: shard i on host i, the evaluator on host `shards`,
    # worker r on host shards + 1 + r.
    netem = None
    if link != "loopback":
        netem = "x%d" % (os.getpid() % 100000000)
        subprocess.run([NETEM, "--up", "--hosts", str(args.shards + 1 + workers),
                        "--link", link, "--name", netem], check=True,
                       stdout=subprocess.DEVNULL, stderr=log)

    def on_host(i, argv):
        if netem is None:
            return argv
        return ["ip", "netns", "exec", "%s-h%d" % (netem, i)] + argv
    curve = os.path.join(rundir, name + ".curve.csv")
    if os.path.exists(curve):
        os.remove(curve)
    try:
        ckpt_flags = []
        if args.checkpoint_every:
            ckpt_dir = os.path.join(rundir, name + ".ckpt")
            os.makedirs(ckpt_dir, exist_ok=True)
            ckpt_flags = ["--checkpoint_dir=" + ckpt_dir,
                          "--checkpoint_every=" + args.checkpoint_every]
        shards = asyncps_cluster.Shards(os.path.join(bindir, "ps_server"),
                                        mode=mode, log=log,
                                        ready_dir=os.path.join(rundir, name + ".ready"))
        os.makedirs(shards.ready_dir, exist_ok=True)
        cluster.shards = shards
        hosts = None
        if netem is not None:
            hosts = [("%s-h%d" % (netem, i), "198.18.0.%d" % (i + 1))
                     for i in range(args.shards)]
        shards.start(args.shards, "--staleness=%d" % args.staleness,
                     "--worker_timeout=30s", *variant_server_flags, *ckpt_flags,
                     netns=hosts)
        servers = shards.servers
        evaluator = cluster.start(on_host(args.shards,
            [os.path.join(bindir, "ps_worker"), "--role=evaluator",
             "--servers=" + servers, "--eval_every=" + args.eval_every,
             "--curve=" + curve] + args.eval_flags.split()))
        # A fixed budget of samples: synchronous modes split it evenly (each
        # step takes one batch from every worker); in async and ssp every
        # worker runs until the servers have applied samples / batch updates,
        # so fast workers do more of the work than a straggler.
        if mode in SYNC_MODES:
            budget = ["--steps=%d" % max(1, args.samples // (workers * args.batch_size))]
        else:
            budget = ["--steps=1000000000",
                      "--stop_at_version=%d" % max(1, args.samples // args.batch_size)]
        slow = float(profile.split(":")[1]) if profile.startswith("slow:") else 1.0
        procs = []
        start = time.time()
        for r in range(workers):
            argv = [os.path.join(bindir, "ps_worker"), "--servers=" + servers,
                    "--rank=%d" % r, "--num_workers=%d" % workers,
                    "--result_json=" + os.path.join(rundir, "%s.rank%d.json" % (name, r)),
                    "--mode=" + mode, "--seed=%d" % seed,
                    "--batch_size=%d" % args.batch_size,
                    "--epochs=1000000", "--log_every=1h"] + budget
            if r == workers - 1 and slow > 1.0:
                argv.append("--slowdown=%g" % slow)
            if netem is not None:  # allreduce's ring: this host's address.
                argv.append("--collective_host=198.18.0.%d" %
                            (args.shards + 2 + r))
            procs.append(cluster.start(on_host(
                args.shards + 1 + r,
                argv + variant_worker_flags + args.worker_flags.split())))
        done = []
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=args.run_timeout)
            result = asyncps_cluster.read_result(
                os.path.join(rundir, "%s.rank%d.json" % (name, r)))
            if p.returncode != 0 or result is None:
                raise RuntimeError("a worker of %s failed: %s" % (name, out[-500:]))
            done.append(result)
        wall = time.time() - start
        hist = subprocess.run(on_host(args.shards, [
            os.path.join(bindir, "psctl"), "--servers=" + servers,
            "histogram"]), capture_output=True, text=True, check=True).stdout
        evaluator.send_signal(signal.SIGTERM)
        evaluator.communicate(timeout=120)
    finally:
        cluster.stop()
        if netem is not None:
            subprocess.run([NETEM, "--down", netem], stderr=log)
        log.close()

    samples = sum(d["samples"] for d in done)
    throughput = samples / wall
    staleness = sum(d["staleness"] for d in done) / len(done)
    dropped = sum(d["dropped"] for d in done)
    per_update = args.batch_size * (workers if mode in SYNC_MODES else 1)

    rows = []
    with open(curve) as f:
        for row in csv.DictReader(f):
            rows.append({
                "seconds": float(row["seconds"]),
                "updates": float(row["updates"]),
                "samples": float(row["updates"]) * per_update,
                "test_loss": float(row["test_loss"]),
                "test_accuracy": float(row["test_accuracy"]),
            })
    with open(os.path.join(rundir, name + ".csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["seconds", "updates", "samples", "test_loss", "test_accuracy",
                    "mode", "workers", "profile", "seed", "samples_per_s",
                    "mean_staleness"])
        for r in rows:
            w.writerow(["%.3f" % r["seconds"], "%.1f" % r["updates"],
                        "%.0f" % r["samples"], "%.6f" % r["test_loss"],
                        "%.6f" % r["test_accuracy"], label, workers, profile, seed,
                        "%.1f" % throughput, "%.3f" % staleness])
    with open(os.path.join(rundir, name + ".hist.csv"), "w") as f:
        f.write(hist)

    def time_to(target):
        for r in rows:
            if r["test_accuracy"] >= target:
                return "%.1f" % r["seconds"]
        return ""

    return {
        "run": name, "mode": label, "link": link, "compress": compress,
        "workers": workers, "profile": profile,
        "seed": seed, "final_accuracy": "%.4f" % rows[-1]["test_accuracy"],
        "best_accuracy": "%.4f" % max(r["test_accuracy"] for r in rows),
        "time_to_0.85": time_to(0.85), "time_to_0.88": time_to(0.88),
        "samples_per_s": "%.0f" % throughput, "mean_staleness": "%.3f" % staleness,
        "dropped": dropped, "wall_s": "%.1f" % wall, "samples": samples,
    }


def gnuplot(script):
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def load_curve(out, run):
    with open(os.path.join(out, "runs", run + ".csv")) as f:
        return [(float(r["seconds"]), float(r["samples"]), float(r["test_accuracy"]))
                for r in csv.DictReader(f)]


def at(curve, col, x):
    """The accuracy of `curve` at x (column col: 0 seconds, 1 samples),
    linearly interpolated; None outside the curve."""
    pts = [(p[col], p[2]) for p in curve]
    if not pts or x < pts[0][0] or x > pts[-1][0]:
        return None
    for (x0, y0), (x1, y1) in zip(pts, pts[1:]):
        if x0 <= x <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return pts[-1][1]


def seed_band(out, runs, col, points=24):
    """Rows (x, mean, min, max) of the runs' accuracy on a common grid of x,
    where every seed's curve covers x."""
    curves = [load_curve(out, r["run"]) for r in runs]
    lo = max(c[0][col] for c in curves)
    hi = min(c[-1][col] for c in curves)
    rows = []
    for k in range(points):
        x = lo + (hi - lo) * k / (points - 1)
        ys = [at(c, col, x) for c in curves]
        ys = [y for y in ys if y is not None]
        if ys:
            rows.append((x, sum(ys) / len(ys), min(ys), max(ys)))
    return rows


def plot(args, out, summary):
    """Accuracy against wall time and samples seen, one line per mode: the
    mean over seeds with error bars from the lowest to the highest seed."""
    pngs = []
    groups = sorted({(r["workers"], r["profile"]) for r in summary})
    for workers, profile in groups:
        runs = [r for r in summary if r["workers"] == workers and r["profile"] == profile]
        labels = list(dict.fromkeys(r["mode"] for r in runs))
        tag = "w%d-%s" % (workers, profile.replace(":", ""))
        for col, xlabel, suffix in ((0, "wall time (s)", "time"),
                                    (1, "samples seen", "samples")):
            png = "accuracy-%s-%s.png" % (suffix, tag)
            parts = []
            for label in labels:
                band = seed_band(out, [r for r in runs if r["mode"] == label], col)
                dat = os.path.join(out, "runs", "band-%s-%s-%s.dat" %
                                   (suffix, tag, label.replace("+", "_")))
                with open(dat, "w") as f:
                    for row in band:
                        f.write("%.3f %.5f %.5f %.5f\n" % row)
                parts.append("'%s' using 1:2:3:4 with yerrorlines title '%s'" %
                             (dat, label))
            seeds = len({r["seed"] for r in runs})
            gnuplot("""set terminal pngcairo size 800,500 noenhanced
set output '%s'
set key bottom right
set title 'Test accuracy, %d workers, stragglers: %s (mean of %d seeds, bars: min-max)'
set xlabel '%s'
set ylabel 'test accuracy'
set yrange [0.5:0.95]
set grid
plot %s
""" % (os.path.join(out, png), workers, profile, seeds, xlabel, ", ".join(parts)))
            pngs.append(png)
        links = list(dict.fromkeys(r["link"] for r in runs))
        if len(links) > 1:
            pngs.append(plot_links(out, runs, links, tag))
        first_seed = runs[0]["seed"]
        async_runs = [r for r in runs if re.split(r"[+ ]", r["mode"])[0] not in SYNC_MODES
                      and r["seed"] == first_seed]
        if async_runs:
            png = "staleness-%s.png" % tag
            lines = ", ".join(
                "'%s/runs/%s.hist.csv' using 1:2 with boxes title '%s'" %
                (out, r["run"], r["mode"]) for r in async_runs)
            gnuplot("""set terminal pngcairo size 800,500 noenhanced
set output '%s'
set datafile separator ','
set style fill transparent solid 0.5
set boxwidth 0.8
set title 'Staleness of applied gradients, %d workers, stragglers: %s (seed %s)'
set xlabel 'staleness (versions applied between pull and push)'
set ylabel 'slice updates'
set xrange [-0.5:20.5]
set grid
plot %s
""" % (os.path.join(out, png), workers, profile, first_seed, lines))
            pngs.append(png)
    return pngs


def plot_links(out, runs, links, tag):
    """Test accuracy against wall time, one panel per link, one line per
    mode and compression (the mean over seeds, where every seed's curve
    covers the time); the same colour for the same run in every panel."""
    png = "accuracy-time-links-%s.png" % tag
    kinds = list(dict.fromkeys((r["mode"].split(" @")[0]) for r in runs))
    panels = []
    for link in links:
        parts = []
        for i, kind in enumerate(kinds):
            rs = [r for r in runs if r["link"] == link and
                  r["mode"].split(" @")[0] == kind]
            if not rs:
                continue
            band = seed_band(out, rs, 0)
            dat = os.path.join(out, "runs", "links-%s-%s-%s.dat" % (
                tag, link, re.sub(r"[^A-Za-z0-9.]+", "_", kind)))
            with open(dat, "w") as f:
                for row in band:
                    f.write("%.3f %.5f\n" % row[:2])
            parts.append("'%s' using 1:2 with lines lw 2 lc %d dt %d title '%s'"
                         % (dat, i % 8 + 1, i // 8 + 1, kind))
        seeds = len({r["seed"] for r in runs if r["link"] == link})
        panels.append("""set title '%s (mean of %d seeds)'
plot %s
""" % (link, seeds, ", ".join(parts)))
    gnuplot("""set terminal pngcairo size %d,520 noenhanced
set output '%s'
set multiplot layout 1,%d
set key bottom right font ',8'
set xlabel 'wall time (s)'
set ylabel 'test accuracy'
set yrange [0.6:0.9]
set ytics 0.05
set grid
%s
unset multiplot
""" % (520 * len(links), os.path.join(out, png), len(links), "".join(panels)))
    return png


def spread(values):
    """'mean ± half the min-max range' of the non-empty values, or '—'."""
    xs = [float(v) for v in values if v not in ("", None)]
    if not xs:
        return "—"
    mean = sum(xs) / len(xs)
    half = (max(xs) - min(xs)) / 2
    digits = 4 if mean < 2 else (1 if mean < 1000 else 0)
    text = "%.*f ± %.*f" % (digits, mean, digits, half)
    if len(xs) < len(values):
        text += " (%d/%d)" % (len(xs), len(values))
    return text


def report(args, out, summary, pngs):
    cols = ["mode", "workers", "profile", "seed", "final_accuracy", "best_accuracy",
            "time_to_0.85", "time_to_0.88", "samples_per_s", "mean_staleness",
            "dropped", "wall_s"]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("# asyncps experiment\n\n")
        f.write("Command: `%s`\n\n" % " ".join(sys.argv))
        f.write("%d samples per run, batch %d, %d shards, ssp staleness %d.\n\n" %
                (args.samples, args.batch_size, args.shards, args.staleness))
        f.write("## Mean over seeds ± half the spread (min to max)\n\n")
        acols = ["final_accuracy", "best_accuracy", "time_to_0.85",
                 "samples_per_s", "mean_staleness", "wall_s"]
        f.write("| mode | workers | profile | seeds | " + " | ".join(acols) + " |\n")
        f.write("|" + " --- |" * (4 + len(acols)) + "\n")
        cells = list(dict.fromkeys((r["mode"], r["workers"], r["profile"])
                                   for r in summary))
        for mode, workers, profile in cells:
            rs = [r for r in summary if (r["mode"], r["workers"], r["profile"]) ==
                  (mode, workers, profile)]
            f.write("| %s | %d | %s | %d | " % (mode, workers, profile, len(rs)) +
                    " | ".join(spread([r[c] for r in rs]) for c in acols) + " |\n")
        f.write("\n## Every run\n\n")
        f.write("| " + " | ".join(cols) + " |\n")
        f.write("|" + " --- |" * len(cols) + "\n")
        for r in summary:
            f.write("| " + " | ".join(str(r[c]) for c in cols) + " |\n")
        f.write("\nTimes are seconds from the evaluator's start to the first "
                "evaluation at or above the accuracy; empty: not reached.\n\n")
        for png in pngs:
            f.write("![%s](%s)\n\n" % (png, png))


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
    for seed in [int(s) for s in args.seeds.split(",")]:
        for workers in [int(w) for w in args.workers.split(",")]:
            for profile in args.profiles.split(","):
                if profile != "none" and not re.fullmatch(r"slow:[0-9.]+", profile):
                    fail("bad profile %r (want none or slow:F)" % profile)
                for link in args.links.split(","):
                    for compress in args.compress.split(","):
                        for mode in args.modes.split(","):
                            variant_flags(mode)  # Fails early on a bad entry.
                            label = run_label(mode, compress, link)
                            if not compatible(mode, compress):
                                print("== %s: skipped (ps_worker refuses "
                                      "this pair)" % label, flush=True)
                                continue
                            print("== %s, %d workers, %s, seed %d" %
                                  (label, workers, profile, seed), flush=True)
                            r = run_one(args, bindir, mode, workers, profile,
                                        seed, rundir, compress, link)
                            print("   final accuracy %s, %s samples/s, staleness "
                                  "%s, %s s, 0.85 at %s s" %
                                  (r["final_accuracy"], r["samples_per_s"],
                                   r["mean_staleness"], r["wall_s"],
                                   r["time_to_0.85"] or "-"), flush=True)
                            summary.append(r)
    with open(os.path.join(out, "summary.csv"), "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(summary[0].keys()))
        w.writeheader()
        w.writerows(summary)
    pngs = plot(args, out, summary)
    report(args, out, summary, pngs)
    print("== report: %s" % os.path.join(out, "report.md"))


if __name__ == "__main__":
    main()
