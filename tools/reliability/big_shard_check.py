#!/usr/bin/python3
"""Checks, outside the test suite (minutes, gigabytes), that a shard of more
than 3 GiB checkpoints, restores and replicates byte-exactly (issue #38,
8): one ps_server with --model_bytes of weights under Adam (the shard
holds 3x that), three pushes, a job checkpoint (psctl checkpoint), a
restart from it, the weights' SHA-256 before and after; then one more push
on the restored shard. Then a replicated pair (--replicas=2, a private
etcd): the same declare and pushes on the first member, a second member
that joins with the whole state as a snapshot, the first killed, and the
promoted backup's weights, and its weights after the same extra push,
compared with the single shard's. While the backup joins, a probe client
pulls and pushes a tiny tensor of the model as fast as it can and prints
its latencies (what a worker sees of the join). Prints sizes, times and
throughput.

  tools/reliability/big_shard_check.py [MODEL_BYTES] [--part all|replicated]
    (default 1100 MiB: 3.2 GiB of state; --part replicated: the pair
    alone, its hashes compared with each other only)

Memory: about 3.3x MODEL_BYTES per server (two at once in the replicated
part) and a few tensors for the client. Env: OUTPUT_BASE (bazel's), WORK,
BAZEL_FLAGS; PS_SERVER, another ps_server binary to run (an earlier
build, for a before/after: one from before 2026-12-07's join, whose log
says "joined at op N (B bytes of state in T)", with OLD_JOIN=1).
"""

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402

# Set once by main(): bazel-bin, the work dir and the model's size.
BIN = WORK = None
MODEL_BYTES = 0
procs = []  # every process started, killed on the way out


def build():
    """ps_server, psctl and big_shard_client built by bazel; its bazel-bin."""
    bazel = ["bazel"]
    if os.environ.get("OUTPUT_BASE"):
        bazel.append(f"--output_base={os.environ['OUTPUT_BASE']}")
    flags = os.environ.get("BAZEL_FLAGS", "").split()
    subprocess.run(["nice", "-n", "10", *bazel, "build", *flags,
                    "//server:ps_server", "//tools:psctl",
                    "//tools/reliability:big_shard_client"],
                   cwd=ROOT, check=True, stderr=subprocess.DEVNULL)
    return subprocess.run([*bazel, "info", *flags, "bazel-bin"], cwd=ROOT,
                          check=True, capture_output=True,
                          text=True).stdout.strip()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server(name, flags, wait=True):
    ready = os.path.join(WORK, name + ".json")
    if os.path.exists(ready):
        os.remove(ready)
    log = open(os.path.join(WORK, name + ".log"), "a")
    p = subprocess.Popen(
        [os.environ.get("PS_SERVER") or f"{BIN}/server/ps_server",
         "--host=127.0.0.1", "--shard=0",
         "--num_shards=1", f"--ready_file={ready}",
         f"--max_shard_bytes={MODEL_BYTES + (64 << 20)}",
         "--max_message_bytes=268435456", *flags],
        stdout=subprocess.DEVNULL, stderr=log)
    procs.append(p)
    start = time.monotonic()
    while wait and not os.path.exists(ready):
        if p.poll() is not None:
            sys.exit(f"{name} exited: see {WORK}/{name}.log")
        time.sleep(0.1)
    p.ready_s = time.monotonic() - start
    p.name = name
    return p


def port_of(name):
    with open(os.path.join(WORK, name + ".json")) as f:
        return json.load(f)["port"]


def client(servers, pushes=0, first=0):
    start = time.monotonic()
    run = subprocess.run(
        [f"{BIN}/tools/reliability/big_shard_client", f"--servers={servers}",
         f"--model_bytes={MODEL_BYTES}", f"--pushes={pushes}",
         f"--first_push={first}"],
        capture_output=True, text=True)
    if run.returncode != 0:
        sys.exit(f"big_shard_client failed: {run.stderr}")
    out = run.stdout
    for line in out.splitlines():
        print("   ", line)
    return re.search(r"sha256 (\w+)", out).group(1), time.monotonic() - start


def rss_gib(p):
    with open(f"/proc/{p.pid}/status") as f:
        kb = int(re.search(r"VmHWM:\s+(\d+)", f.read()).group(1))
    return kb / (1 << 20)


def stop(p, sig=signal.SIGTERM):
    p.send_signal(sig)
    p.wait()


def gib(n):
    return n / (1 << 30)


def single_shard():
    """One shard: checkpoint, restart, compare. Returns (the weights' hash
    after 3 pushes, after one more on the restored shard, whether the
    restored weights were equal)."""
    ckpt = os.path.join(WORK, "ckpt")
    os.makedirs(ckpt, exist_ok=True)
    flags = [f"--checkpoint_dir={ckpt}", "--checkpoint_every=0s"]
    s1 = server("single", flags + ["--port=0"])
    addr = f"127.0.0.1:{port_of('single')}"
    print("single shard: declare, 3 pushes, pull")
    h1, _ = client(addr, pushes=3)
    t = time.monotonic()
    subprocess.run([f"{BIN}/tools/psctl", f"--servers={addr}", "checkpoint",
                    "--tag=big", "--timeout=600s"], check=True,
                   capture_output=True)
    took = time.monotonic() - t
    path = os.path.join(ckpt, "job-big-shard-0.ckpt")
    size = os.path.getsize(path)
    print(f"checkpoint: {gib(size):.2f} GiB in {took:.1f} s "
          f"({gib(size) / took:.2f} GiB/s), server peak RSS "
          f"{rss_gib(s1):.2f} GiB")
    stop(s1)
    s2 = server("restored", flags + ["--port=0", "--restore_job=big"])
    print(f"restore: ready {s2.ready_s:.1f} s after start "
          f"({gib(size) / s2.ready_s:.2f} GiB/s), peak RSS "
          f"{rss_gib(s2):.2f} GiB")
    h2, _ = client(f"127.0.0.1:{port_of('restored')}")
    print(f"weights after restore {'EQUAL' if h2 == h1 else 'DIFFER'}")
    h3, _ = client(f"127.0.0.1:{port_of('restored')}", pushes=1, first=3)
    stop(s2)
    return h1, h3, h2 == h1


def start_etcd():
    """A private single-member etcd; its client port."""
    etcd_port, peer = free_port(), free_port()
    etcd = subprocess.Popen(
        ["etcd", "--name=big", f"--data-dir={WORK}/etcd",
         f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
         f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
         f"--listen-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
         f"--initial-cluster=big=http://127.0.0.1:{peer}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(etcd)
    return etcd_port


def wait_for_join(backup, since):
    """The primary's log line for the backup's join: (bytes, how long
    changes paused for the copy, took in all, how it caught up)."""
    log0 = os.path.join(WORK, "member0.log")
    while True:
        with open(log0) as f:
            log = f.read()
        m = re.search(r"in sync at op \d+ \((\d+) bytes of state; changes "
                      r"paused ([^ ]*) for its copy; ([^ ]*) in all; ([^)]*)\)",
                      log)
        if m:
            return int(m.group(1)), m.group(2), m.group(3), m.group(4)
        # The earlier join: changes paused for all of it.
        m = re.search(r"joined at op \d+ \((\d+) bytes of state in ([^)]*)\)",
                      log)
        if m:
            return int(m.group(1)), m.group(2), m.group(2), "the old join"
        if backup.poll() is not None or time.monotonic() - since > 600:
            sys.exit("the backup did not join: see member*.log")
        time.sleep(0.2)


def replicated_pair(h1, h3):
    """A replicated pair: the second member joins with a big snapshot, the
    first is killed; True if every hash matched the single shard's."""
    ok = True
    etcd_port = start_etcd()
    ports = [free_port(), free_port()]
    rflags = ["--replicas=2", f"--etcd=127.0.0.1:{etcd_port}", "--job=big",
              "--replica_ack_timeout=120s", "--min_insync=1"]
    if not os.environ.get("OLD_JOIN"):
        rflags.append("--join_backlog_bytes=6442450944")
    a = server("member0", rflags + [f"--port={ports[0]}", "--bootstrap",
                                    f"--advertise=127.0.0.1:{ports[0]}"])
    group = "|".join(f"127.0.0.1:{p}" for p in ports)
    print("replicated: declare, 3 pushes on the first member, pull")
    h4, _ = client(group, pushes=3)
    if h1 is None:
        h1 = h4
    print(f"   same weights as the single shard: {h4 == h1}")
    ok &= h4 == h1
    stop_file = os.path.join(WORK, "probe.stop")
    probe = subprocess.Popen(
        [f"{BIN}/tools/reliability/big_shard_client", f"--servers={group}",
         f"--model_bytes={MODEL_BYTES}", f"--probe_until={stop_file}"],
        stdout=subprocess.PIPE, text=True)
    procs.append(probe)
    probe.stdout.readline()  # "probing": joined, declared, pushing.
    time.sleep(2)  # The probe's own pace before the join.
    t = time.monotonic()
    b = server("member1", rflags + [f"--port={ports[1]}",
                                    f"--advertise=127.0.0.1:{ports[1]}"])
    snap, paused, primary_took, how = wait_for_join(b, t)
    took = time.monotonic() - t
    time.sleep(1)
    open(stop_file, "w").close()
    for line in probe.communicate()[0].strip().splitlines():
        print(f"   {line}")
    print(f"   (the probe: 2 s before the backup's start, {took:.1f} s "
          "until it was in sync, 1 s after)")
    print(f"snapshot: {gib(snap):.2f} GiB to the backup (primary: changes "
          f"paused {paused} for its copy, {primary_took} in all, {how}; "
          f"{took:.1f} s from the backup's start, "
          f"{gib(snap) / took:.2f} GiB/s); peak RSS primary "
          f"{rss_gib(a):.2f} GiB, backup {rss_gib(b):.2f} GiB")
    stop(a, signal.SIGKILL)
    t = time.monotonic()
    h5, _ = client(group)
    print(f"promoted backup answered in {time.monotonic() - t:.1f} s; weights "
          f"{'EQUAL' if h5 == h1 else 'DIFFER'}")
    ok &= h5 == h1
    h6, _ = client(group, pushes=1, first=3)
    if h3 is None:
        return ok
    print(f"one more push: restored shard and promoted backup "
          f"{'EQUAL' if h6 == h3 else 'DIFFER'} (optimizer state too)")
    ok &= h6 == h3
    return ok


def main():
    global BIN, WORK, MODEL_BYTES
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("model_bytes", nargs="?", type=int, default=1100 << 20)
    p.add_argument("--part", choices=("all", "replicated"), default="all")
    args = p.parse_args()
    MODEL_BYTES = args.model_bytes
    BIN = build()
    WORK = os.environ.get("WORK") or tempfile.mkdtemp(prefix="big_shard.")
    os.makedirs(WORK, exist_ok=True)
    print(f"work dir: {WORK}")
    state = 3 * MODEL_BYTES  # weights + Adam's two slots
    print(f"model: {gib(MODEL_BYTES):.2f} GiB of weights, "
          f"{gib(state):.2f} GiB of shard state with Adam")
    try:
        h1, h3, ok = (single_shard() if args.part == "all"
                      else (None, None, True))
        ok &= replicated_pair(h1, h3)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
