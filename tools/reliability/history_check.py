#!/usr/bin/python3
"""The history checker (issue #38): a job of 2 shards and 2 worker
processes on 127.0.0.1 whose every push is journaled with its answer, while
faults are injected on a seeded schedule; at the end a fresh reader pulls
the servers' state and tools/reliability/history_model.py compares it with the
model of the promises (docs/RELIABILITY.md "The guarantees, and their exact
limits"; docs/RELIABILITY.md "The history checker" describes the run).

  tools/reliability/history_check.py [--bin DIR] [--out DIR] [--seconds S]
                                     [--every S] [--seeds A-B | --seeds N]
                                     [--minutes M] [--combos LIST|all]
                                     [--known NAMES]

A combo is mode[/rows][/r2][/elastic]: mode async, ssp or bsp (allreduce keeps no
state on the servers, only the initial weights and rank 0's hand-overs:
there is nothing there to check a push against); /rows pushes rows of an
embedding table too; /r2 runs each shard as a group of 2 ps_server members
with a private etcd (its tables too); /elastic runs the shards with
--elastic and has workers of ranks 2 and 3 join and leave (SIGTERM) while
the job trains (docs/ELASTIC.md).
--seeds A-B runs those seeds over every combo; --seeds N with --minutes M
is a soak: seeds 1, 2, ... (the combo taking turns) until N runs or M
minutes. One line per run, then a summary; the exit status is 1 if a
violation of a kind not named in --known (comma list) was found. --bin
takes ps_server and psctl from DIR (else bazel builds them); the asyncps
module comes from $PYTHONPATH, the runfiles or bazel-bin. Each run's
server logs, worker journals and logs stay under --out.
"""

import argparse
import glob
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402
from tools.progress import Progress  # noqa: E402
from tools.reliability import history_faults as hf  # noqa: E402
from tools.reliability import history_model  # noqa: E402
from tools.reliability import history_worker as hw  # noqa: E402

MODES = ("async", "ssp", "bsp")
ALL_COMBOS = ["async", "ssp", "bsp", "async/rows", "ssp/rows", "bsp/rows",
              "async/r2", "ssp/r2", "bsp/r2", "async/rows/r2", "ssp/rows/r2",
              "bsp/rows/r2", "async/elastic", "ssp/elastic", "bsp/elastic",
              "bsp/rows/elastic"]


def combo_arg(text):
    combos = ALL_COMBOS if text == "all" else text.split(",")
    for c in combos:
        parts = c.split("/")
        if (parts[0] not in MODES or any(x not in ("rows", "r2", "elastic")
                                         for x in parts[1:])
                or len(set(parts)) != len(parts)):
            raise argparse.ArgumentTypeError(
                f"'{c}' is not mode[/rows][/r2][/elastic] with mode in "
                f"{', '.join(MODES)} (allreduce has no server state)")
    return combos


def seeds_arg(text):
    m = re.fullmatch(r"([0-9]+)(?:-([0-9]+))?", text)
    if not m or int(m[1]) < 1 or (m[2] and int(m[2]) < int(m[1])):
        raise argparse.ArgumentTypeError(f"must be A-B or N, not '{text}'")
    return (int(m[1]), int(m[2])) if m[2] else int(m[1])


def parse(argv=None):
    p = argparse.ArgumentParser(prog="history_check.py",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default="")
    p.add_argument("--out", default="")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--every", type=float, default=2.0)
    p.add_argument("--seeds", type=seeds_arg, default=(1, 1))
    p.add_argument("--minutes", type=float, default=0.0)
    p.add_argument("--combos", type=combo_arg, default=["async", "bsp"])
    p.add_argument("--known", default="")
    p.add_argument("--replay", nargs="+", default=[], metavar="RUN_DIR",
                   help="judge kept runs (OUT/seedN-COMBO) again with the "
                   "current model; nothing is started")
    a = p.parse_args(argv)
    if a.seconds <= 0 or a.every <= 0:
        p.error("--seconds and --every must be positive")
    a.known = set(filter(None, a.known.split(",")))
    return a


def python_path():
    """Where `import asyncps` works: $PYTHONPATH, the runfiles' python/
    (bazel test), or bazel-bin/python."""
    for d in os.environ.get("PYTHONPATH", "").split(os.pathsep) + [
            os.path.join(ROOT, "python"), os.path.join(ROOT, "bazel-bin",
                                                       "python")]:
        if d and os.path.exists(os.path.join(d, "asyncps", "_core.so")):
            return os.path.abspath(d)
    raise SystemExit("history_check: no asyncps module (bazel build "
                     "//python:asyncps, or set PYTHONPATH)")


def build(out):
    """ps_server and psctl built by bazel, copied to out/bin."""
    subprocess.run(["bazel", "build", "--noshow_progress",
                    "//server:ps_server", "//tools:psctl",
                    "//python:asyncps"],
                   cwd=ROOT, check=True, stdout=sys.stderr)
    built = subprocess.run(["bazel", "info", "bazel-bin"], cwd=ROOT,
                           capture_output=True, text=True,
                           check=True).stdout.strip()
    d = os.path.join(out, "bin")
    os.makedirs(d, exist_ok=True)
    for b in ("server/ps_server", "tools/psctl"):
        target = os.path.join(d, os.path.basename(b))
        if os.path.exists(target):
            os.remove(target)
        shutil.copy(os.path.join(built, b), target)
    return d


def read_state(servers, rows_used, pypath):
    """The servers' final state through a fresh reader client."""
    if pypath not in sys.path:
        sys.path.insert(0, pypath)
    import asyncps
    import numpy as np
    reader = asyncps.Client(servers, reader=True, retry_for=30.0)
    reader.attach()
    dense = reader.pull()
    rows = {}
    if rows_used:
        reader.declare_embedding(hw.TABLE, hw.DIM, optimizer="sgd", lr=1.0,
                                 init_stddev=0.0)
        ids = sorted(rows_used)
        got = reader.pull_rows(hw.TABLE, np.array(ids, dtype=np.int64))
        rows = {i: got[k] for k, i in enumerate(ids)}
    return dense, rows


def save(d, job, dense, rows):
    """The run's faults and final state, beside its journals (evidence)."""
    import numpy as np
    with open(os.path.join(d, "faults.json"), "w") as f:
        json.dump({"t0": job.t0, "faults": job.faults}, f, indent=1)
    np.savez(os.path.join(d, "final.npz"), **dense,
             row_ids=np.array(sorted(rows), dtype=np.int64),
             rows=np.array([rows[i] for i in sorted(rows)],
                           dtype=np.float32).reshape(-1, hw.DIM))


def run_one(args, seed, combo, pypath):
    """One seed of one combo; returns (line, violations, counts)."""
    label = f"seed {seed} combo {combo}"
    d = os.path.join(args.out, f"seed{seed}-{combo.replace('/', '-')}")
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    job = hf.Job(args, combo, seed, d, pypath)
    try:
        job.start()
        job.inject(random.Random(seed), args.seconds, args.every)
        job.finish()
        if job.mode == "bsp":
            # A step pending when the last ranks left completes at the
            # shard's next tick, or, on a shard restarted or a member
            # promoted in the last --worker_timeout, once it stops
            # presuming the ranks it has not heard from: the final state
            # is read after both (read at once, seeds 9 and 11 of
            # bsp/rows/r2 saw such a step pending about one run in two;
            # docs/RELIABILITY.md).
            time.sleep(hf.WORKER_TIMEOUT + 0.5)
        rows_used = job.rows_used()
        dense, rows = read_state(job.servers, rows_used, pypath)
    except hf.JobFailed as e:
        line = f"{label}: VIOLATION stuck: {e} (logs in {d})"
        return line, [("stuck", line)], (0, 0, len(job.faults))
    except RuntimeError as e:  # The reader's pull: a shard without a model.
        line = (f"{label}: VIOLATION model_lost: the final state cannot be "
                f"read ({e}) (logs in {d})")
        return line, [("model_lost", line)], (0, 0, len(job.faults))
    finally:
        job.stop()
    save(d, job, dense, rows)
    history = history_model.History(job.journals(), job.faults, dense, rows,
                                    job.model_config())
    checker = history_model.Checker(history, label)
    violations = checker.run()
    pushes = len(history.pushes)
    acked = sum(p.outcome == "acked" for p in history.pushes.values())
    counts = (pushes, acked, len(job.faults))
    if not violations:
        line = (f"{label}: ok, {pushes} pushes ({acked} acked), "
                f"{len(job.faults)} faults")
    else:
        kinds = sorted({k for k, _ in violations})
        line = (f"{label}: VIOLATION {len(violations)} ({', '.join(kinds)}), "
                f"{pushes} pushes ({acked} acked), {len(job.faults)} faults "
                f"(logs in {d})")
    return line, violations, counts


def schedule(args):
    """The (seed, combo) runs: a range over every combo, or a soak."""
    if isinstance(args.seeds, tuple):
        first, last = args.seeds
        for seed in range(first, last + 1):
            for combo in args.combos:
                yield seed, combo
        return
    seed = 0
    while True:
        seed += 1
        if seed > args.seeds:
            return
        yield seed, args.combos[(seed - 1) % len(args.combos)]


def replay(d):
    """A kept run (its journals, faults.json and final.npz) judged again:
    (line, violations)."""
    import numpy as np
    combo = re.match(r"seed\d+-(.+)$", os.path.basename(d.rstrip("/")))
    if combo is None or not os.path.exists(os.path.join(d, "final.npz")):
        raise SystemExit(f"history_check: {d} is not a kept run folder "
                         "(seedN-COMBO with final.npz)")
    parts = combo.group(1).split("-")
    journals = {}
    for path in glob.glob(os.path.join(d, "journal-*.jsonl")):
        rank, gen = re.search(r"journal-(\d+)-(\d+)", path).groups()
        journals[(int(rank), int(gen))] = hw.read_journal(path)
    with open(os.path.join(d, "faults.json")) as f:
        faults = json.load(f)
    z = np.load(os.path.join(d, "final.npz"))
    dense = {n: z[n] for n in hw.NAMES}
    rows = {int(i): z["rows"][k] for k, i in enumerate(z["row_ids"])}
    config = {"mode": parts[0], "workers": hf.WORKERS, "shards": hf.SHARDS,
              "replicated": "r2" in parts, "t0": faults["t0"],
              "worker_timeout": hf.WORKER_TIMEOUT,
              "elastic": "elastic" in parts}
    history = history_model.History(journals, faults["faults"], dense, rows,
                                    config)
    violations = history_model.Checker(history, d).run()
    return f"{d}: {len(violations) or 'no'} violation(s)", violations


def main(argv=None):
    args = parse(argv)
    if args.replay:
        bad = 0
        for d in args.replay:
            line, violations = replay(d)
            print(line)
            for _, text in violations[:20]:
                print("  " + text)
            bad += bool(violations)
        return 1 if bad else 0
    if not args.out:
        args.out = tempfile.mkdtemp(prefix="asyncps-history.")
    os.makedirs(args.out, exist_ok=True)
    args.out = os.path.abspath(args.out)
    args.bin = os.path.abspath(args.bin) if args.bin else build(args.out)
    pypath = python_path()
    seeds = ("-".join(map(str, args.seeds)) if isinstance(args.seeds, tuple)
             else f"up to {args.seeds}")
    print(f"== history check: combos {','.join(args.combos)}, seeds "
          f"{seeds}, {args.seconds:g} s each, a fault every "
          f"{args.every:g} s; logs in {args.out}", flush=True)
    start = time.monotonic()
    runs, by_kind, failed = 0, {}, []
    fatal = False
    progress = Progress(
        total=(args.seeds[1] - args.seeds[0] + 1) * len(args.combos)
        if isinstance(args.seeds, tuple) else args.seeds,
        minutes=args.minutes or None)
    for seed, combo in schedule(args):
        if args.minutes and time.monotonic() - start > args.minutes * 60:
            break
        tag = progress.tag()
        line, violations, _ = run_one(args, seed, combo, pypath)
        runs += 1
        progress.step()
        print(f"{tag} {line}", flush=True)
        for kind, text in violations[:20]:
            print("  " + text, flush=True)
        if len(violations) > 20:
            print(f"  ... {len(violations) - 20} more", flush=True)
        for kind, _ in violations:
            by_kind[kind] = by_kind.get(kind, 0) + 1
        if violations:
            failed.append(f"{seed}:{combo}")
        fatal |= any(k not in args.known for k, _ in violations)
    kinds = ", ".join(f"{k} {n}" for k, n in sorted(by_kind.items()))
    known = f" (known: {','.join(sorted(args.known))})" if args.known else ""
    print(f"summary: {runs} runs, {len(failed)} with violations "
          f"({kinds or 'none'}){known}; failed: "
          f"{' '.join(failed) or 'none'}", flush=True)
    return 1 if fatal else 0


if __name__ == "__main__":
    sys.exit(main())
