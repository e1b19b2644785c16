"""One run of tools/experiments/experiment.py's grid: a clean cluster on
127.0.0.1 (or on emulated hosts), shards, an evaluator and the workers, trained
for a fixed budget of samples and stopped; its curve and histogram written under
runs/ and its row of summary.csv returned.
"""

import csv
import os
import re
import signal
import subprocess
import sys
import time

from tools import ROOT  # first: it makes `asyncps` importable
from asyncps import cluster as asyncps_cluster  # noqa: I100

SYNC_MODES = ("bsp", "allreduce")
# An outer optimizer's local steps a round, unless the variant names them
# (async+diloco16).
OUTER_LOCAL_STEPS = 8


def local_steps(worker_flags):
    """The steps a server update stands for: --local_steps, else 1."""
    for flag in worker_flags:
        if flag.startswith("--local_steps="):
            return int(flag.split("=", 1)[1])
    return 1
NETEM = os.path.join(ROOT, "deploy", "netem_cluster.sh")


def fail(msg):
    print("experiment: " + msg, file=sys.stderr)
    sys.exit(1)


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
    if variant in ("dc", "dca") and mode in ("async", "ssp"):
        return mode, [], ["--stale_policy=%s:0.04" % variant]
    # Outer optimizers (docs/MODES.md): H local steps of plain SGD (lr
    # 0.05) a round; diloco in async, ssp (delayed Nesterov) and bsp
    # (synchronous), easgd in async and ssp.
    # async+dylu: diloco with dynamic local updates (async only).
    m = re.fullmatch(r"(diloco|easgd|dylu)([0-9]*)", variant)
    if m and (mode in ("async", "ssp") or
              (mode == "bsp" and m.group(1) == "diloco")):
        dynamic = m.group(1) == "dylu"
        return mode, ["--outer=" + ("diloco" if dynamic else m.group(1)),
                      "--local_steps=%d" % int(
                          m.group(2) or OUTER_LOCAL_STEPS),
                      "--optimizer=sgd", "--lr=0.05"] + (
            ["--dynamic_local_steps"] if dynamic else []), []
    m = re.fullmatch(r"backup([0-9]+)", variant)
    if m and mode == "bsp":
        return mode, [], ["--backup_workers=" + m.group(1)]
    fail("unknown variant %r of %s" % (variant, mode))


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
    """Runs one point of the grid (args: experiment.py's flags) with the
    binaries of `bindir`, and returns its row of summary.csv; writes
    <run>.csv, .hist.csv and .log in `rundir`. RuntimeError if a worker
    fails."""
    run = Run(args, bindir, rundir, mode_label, workers, profile, seed,
              compress, link)
    run.train()
    return run.write()


class Run:
    """One run: its name, its files in `rundir` and, while it trains, its
    processes (on emulated hosts with --links other than loopback: shard i
    on host i, the evaluator on host `shards`, worker r on host shards + 1
    + r)."""

    def __init__(self, args, bindir, rundir, mode_label, workers, profile,
                 seed, compress, link):
        self.args, self.bindir, self.rundir = args, bindir, rundir
        self.mode, self.worker_flags, self.server_flags = variant_flags(
            mode_label)
        self.label = run_label(mode_label, compress, link)
        if compress != "none":
            self.worker_flags = self.worker_flags + ["--compress=" + compress]
        self.workers, self.profile, self.seed = workers, profile, seed
        self.compress, self.link = compress, link
        self.name = "%s-w%d-%s-s%d" % (
            re.sub(r"[^A-Za-z0-9.]+", "_", self.label), workers,
            profile.replace(":", ""), seed)
        self.curve = self.path(".curve.csv")
        self.netem = None  # The emulated hosts' name prefix, if any.
        # What train() found: results, wall seconds, psctl histogram.
        self.done, self.wall, self.hist = [], 0.0, ""

    def path(self, suffix):
        return os.path.join(self.rundir, self.name + suffix)

    def on_host(self, i, argv):
        """`argv` run on emulated host i (as it is on loopback)."""
        if self.netem is None:
            return argv
        return ["ip", "netns", "exec", "%s-h%d" % (self.netem, i)] + argv

    def train(self):
        """Starts the cluster, trains to the budget and stops everything
        (and removes the emulated hosts), whatever happens."""
        args = self.args
        log = open(self.path(".log"), "w")
        cluster = Cluster(log)
        if self.link != "loopback":
            self.netem = "x%d" % (os.getpid() % 100000000)
            subprocess.run([NETEM, "--up", "--hosts",
                            str(args.shards + 1 + self.workers),
                            "--link", self.link, "--name", self.netem],
                           check=True, stdout=subprocess.DEVNULL, stderr=log)
        if os.path.exists(self.curve):
            os.remove(self.curve)
        try:
            servers = self._start_shards(cluster, log)
            evaluator = cluster.start(self.on_host(args.shards,
                [os.path.join(self.bindir, "ps_worker"), "--role=evaluator",
                 "--servers=" + servers, "--eval_every=" + args.eval_every,
                 "--curve=" + self.curve] + args.eval_flags.split()))
            start = time.time()
            procs = [cluster.start(self.on_host(args.shards + 1 + r,
                                                self._worker_argv(r, servers)))
                     for r in range(self.workers)]
            self.done = self._wait(procs)
            self.wall = time.time() - start
            self.hist = subprocess.run(self.on_host(args.shards, [
                os.path.join(self.bindir, "psctl"), "--servers=" + servers,
                "histogram"]), capture_output=True, text=True,
                check=True).stdout
            evaluator.send_signal(signal.SIGTERM)
            evaluator.communicate(timeout=120)
        finally:
            cluster.stop()
            if self.netem is not None:
                subprocess.run([NETEM, "--down", self.netem], stderr=log)
            log.close()

    def _start_shards(self, cluster, log):
        """Starts the shards (checkpointing with --checkpoint_every) and
        returns their servers line."""
        args = self.args
        ckpt_flags = []
        if args.checkpoint_every:
            ckpt_dir = self.path(".ckpt")
            os.makedirs(ckpt_dir, exist_ok=True)
            ckpt_flags = ["--checkpoint_dir=" + ckpt_dir,
                          "--checkpoint_every=" + args.checkpoint_every]
        shards = asyncps_cluster.Shards(
            os.path.join(self.bindir, "ps_server"), mode=self.mode, log=log,
            ready_dir=self.path(".ready"))
        os.makedirs(shards.ready_dir, exist_ok=True)
        cluster.shards = shards
        hosts = None
        if self.netem is not None:
            hosts = [("%s-h%d" % (self.netem, i), "198.18.0.%d" % (i + 1))
                     for i in range(args.shards)]
        shards.start(args.shards, "--staleness=%d" % args.staleness,
                     "--worker_timeout=30s", *self.server_flags, *ckpt_flags,
                     netns=hosts)
        return shards.servers

    def _worker_argv(self, r, servers):
        """Worker r's command line. A fixed budget of samples: synchronous
        modes split it evenly (each step takes one batch from every
        worker); in async and ssp every worker runs until the servers have
        applied samples / batch updates, so fast workers do more of the
        work than a straggler."""
        args, workers = self.args, self.workers
        if self.mode in SYNC_MODES:
            budget = ["--steps=%d" % max(
                1, args.samples // (workers * args.batch_size))]
        else:
            # An update of an outer optimizer is a round of local steps.
            budget = ["--steps=1000000000", "--stop_at_version=%d" % max(
                1, args.samples // (args.batch_size *
                                    local_steps(self.worker_flags)))]
        profile = self.profile
        slow = float(profile.split(":")[1]) if profile.startswith("slow:") \
            else 1.0
        argv = [os.path.join(self.bindir, "ps_worker"), "--servers=" + servers,
                "--rank=%d" % r, "--num_workers=%d" % workers,
                "--result_json=" + self.path(".rank%d.json" % r),
                "--mode=" + self.mode, "--seed=%d" % self.seed,
                "--batch_size=%d" % args.batch_size,
                "--epochs=1000000", "--log_every=1h"] + budget
        if r == workers - 1 and slow > 1.0:
            argv.append("--slowdown=%g" % slow)
        if self.netem is not None:  # allreduce's ring: this host's address.
            argv.append("--collective_host=198.18.0.%d" %
                        (args.shards + 2 + r))
        return argv + self.worker_flags + args.worker_flags.split()

    def _wait(self, procs):
        """The workers' results, in rank order; RuntimeError if one
        failed."""
        done = []
        for r, p in enumerate(procs):
            out, _ = p.communicate(timeout=self.args.run_timeout)
            result = asyncps_cluster.read_result(
                self.path(".rank%d.json" % r))
            if p.returncode != 0 or result is None:
                raise RuntimeError("a worker of %s failed: %s" %
                                   (self.name, out[-500:]))
            done.append(result)
        return done

    def write(self):
        """Writes the run's curve (<run>.csv) and histogram (.hist.csv) and
        returns its row of summary.csv."""
        done, wall = self.done, self.wall
        samples = sum(d["samples"] for d in done)
        throughput = samples / wall
        staleness = sum(d["staleness"] for d in done) / len(done)
        dropped = sum(d["dropped"] for d in done)
        rows = self._curve_rows()
        with open(self.path(".csv"), "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(["seconds", "updates", "samples", "test_loss",
                        "test_accuracy", "mode", "workers", "profile", "seed",
                        "samples_per_s", "mean_staleness"])
            for r in rows:
                w.writerow(["%.3f" % r["seconds"], "%.1f" % r["updates"],
                            "%.0f" % r["samples"], "%.6f" % r["test_loss"],
                            "%.6f" % r["test_accuracy"], self.label,
                            self.workers, self.profile, self.seed,
                            "%.1f" % throughput, "%.3f" % staleness])
        with open(self.path(".hist.csv"), "w") as f:
            f.write(self.hist)

        def time_to(target):
            for r in rows:
                if r["test_accuracy"] >= target:
                    return "%.1f" % r["seconds"]
            return ""

        return {
            "run": self.name, "mode": self.label, "link": self.link,
            "compress": self.compress, "workers": self.workers,
            "profile": self.profile, "seed": self.seed,
            "final_accuracy": "%.4f" % rows[-1]["test_accuracy"],
            "best_accuracy": "%.4f" % max(r["test_accuracy"] for r in rows),
            "time_to_0.85": time_to(0.85), "time_to_0.88": time_to(0.88),
            "samples_per_s": "%.0f" % throughput,
            "mean_staleness": "%.3f" % staleness,
            "dropped": dropped, "wall_s": "%.1f" % wall, "samples": samples,
            "sent_mb_per_worker": "%.1f" % (
                sum(d.get("sent_bytes", 0) for d in done) / len(done) / 1e6),
        }

    def _curve_rows(self):
        """The evaluator's curve, with the samples seen at each point."""
        per_update = self.args.batch_size * local_steps(
            self.worker_flags) * (
            self.workers if self.mode in SYNC_MODES else 1)
        rows = []
        with open(self.curve) as f:
            for row in csv.DictReader(f):
                rows.append({
                    "seconds": float(row["seconds"]),
                    "updates": float(row["updates"]),
                    "samples": float(row["updates"]) * per_update,
                    "test_loss": float(row["test_loss"]),
                    "test_accuracy": float(row["test_accuracy"]),
                })
        return rows
