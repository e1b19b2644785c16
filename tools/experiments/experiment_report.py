"""The report of tools/experiments/experiment.py's grid, from its summary and
the runs' curves: gnuplot plots of test accuracy against wall time and samples
seen (the mean over seeds with the min-max spread), staleness histograms, and
report.md with the tables.
"""

import csv
import os
import re
import subprocess
import sys

from tools.experiments.experiment_run import SYNC_MODES


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


def report(args, out, summary, pngs, failed=()):
    """Writes report.md: the tables of `summary`'s runs, the runs in
    `failed` ((label, workers, profile, seed, why): a worker exited
    non-zero, e.g. a diverged loss), and the plots."""
    cols = ["mode", "workers", "profile", "seed", "final_accuracy", "best_accuracy",
            "time_to_0.85", "time_to_0.88", "samples_per_s", "mean_staleness",
            "dropped", "wall_s", "sent_mb_per_worker"]
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write("# asyncps experiment\n\n")
        f.write("Command: `%s`\n\n" % " ".join(sys.argv))
        f.write("%d samples per run, batch %d, %d shards, ssp staleness %d.\n\n" %
                (args.samples, args.batch_size, args.shards, args.staleness))
        f.write("## Mean over seeds ± half the spread (min to max)\n\n")
        acols = ["final_accuracy", "best_accuracy", "time_to_0.85",
                 "samples_per_s", "mean_staleness", "wall_s",
                 "sent_mb_per_worker"]
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
        if failed:
            f.write("## Runs that failed (not in the tables)\n\n")
            f.write("| mode | workers | profile | seed | why |\n")
            f.write("| --- | --- | --- | --- | --- |\n")
            for label, workers, profile, seed, why in failed:
                f.write("| %s | %d | %s | %d | %s |\n" % (
                    label, workers, profile, seed,
                    why.replace("|", "/").replace("\n", " ")))
            f.write("\n")
        for png in pngs:
            f.write("![%s](%s)\n\n" % (png, png))
