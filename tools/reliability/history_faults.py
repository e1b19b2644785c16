"""The processes of one history-check run (tools/reliability/history_check.py)
and the faults injected into them: 2 shards (or 2 groups of 2 members with a
private etcd), 2 worker processes (tools/reliability/history_worker.py), and on
a seeded schedule one of

- shard_kill: SIGKILL an unreplicated shard and start it again on its port;
  it restores its newest checkpoint (--checkpoint_every 500ms), whose time
  its log names;
- primary_kill, backup_kill: SIGKILL a group member and start it again (it
  joins as a backup); primary_stop: SIGSTOP the primary for 2.5 leases,
  then SIGCONT (a backup is promoted meanwhile; the old primary fences
  itself); etcd_restart: SIGKILL etcd, and 2.5 leases later start it again
  with its data (every primary fences itself; backups are elected once
  etcd is back). A member fault waits until its group has a backup in sync, so
  no fault takes a group's last copy of the state (a documented loss);
- worker_kill: SIGKILL a worker (mid-push: they push all the time) and
  start it again with the same rank (a new journal file);
- drop_conn: close a worker's TCP connections to one shard (ss -K, as
  root), which the client must survive by retrying;
- elastic runs (ps_server --elastic, docs/ELASTIC.md) also: worker_join,
  a worker of rank 2 or 3 started while the job trains; worker_leave, one
  of them SIGTERMed (it leaves after its step). Every rank then has
  ELEMS / 4 slots.

Shards are started through asyncps.cluster's Shard (python/package), as
tools/reliability/chaos.py does; group members learn their primary from etcd,
and the checker from `psctl status`.
"""

import glob
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime

# tools first: importing it makes `asyncps` importable.
from tools.reliability import history_worker as hw
from asyncps import cluster  # noqa: I100

HERE = os.path.dirname(os.path.abspath(__file__))

SHARDS, WORKERS = 2, 2
JOINERS = (2, 3)  # Elastic runs: the ranks that join and leave.
WORKER_TIMEOUT = 3.0
LEASE = 1.0


class JobFailed(RuntimeError):
    """The job could not go on (a process that would not start, a worker
    that never finished)."""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def etcd_argv(directory):
    """A private etcd with elections fast enough for 1 s leases (as
    tools/reliability/chaos.py's): (argv, "127.0.0.1:port")."""
    client, peer = free_port(), free_port()
    return (["etcd", "--name=history", f"--data-dir={directory}/etcd",
             f"--listen-client-urls=http://127.0.0.1:{client}",
             f"--advertise-client-urls=http://127.0.0.1:{client}",
             f"--listen-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
             f"--initial-cluster=history=http://127.0.0.1:{peer}",
             "--heartbeat-interval=50", "--election-timeout=500"],
            f"127.0.0.1:{client}")


def start_etcd(directory, argv):
    """etcd with `argv`, logging to DIR/etcd.log; its Popen."""
    log = open(os.path.join(directory, "etcd.log"), "a")
    proc = subprocess.Popen(argv, stdout=log, stderr=log)
    log.close()
    return proc


def restored_at(log_path, offset):
    """The time of the checkpoint a restarted shard restored (its log
    after `offset`), or None."""
    with open(log_path, errors="replace") as f:
        f.seek(offset)
        text = f.read()
    m = re.findall(r"restored model .* taken at (\S+)\)", text)
    if not m:
        return None
    return datetime.fromisoformat(m[-1]).timestamp()


class Job:
    """One run's processes; `faults` lists what was injected."""

    def __init__(self, args, combo, seed, directory, pypath):
        parts = combo.split("/")
        self.mode, self.rows = parts[0], "rows" in parts
        self.replicated = "r2" in parts
        self.elastic = "elastic" in parts
        self.args, self.seed, self.dir, self.pypath = args, seed, directory, \
            pypath
        self.members = []  # Every ps_server process: (shard, Shard).
        self.workers = {}
        self.etcd = None
        self.faults = []
        self.t0 = time.time()
        self._logs = []

    # Starting and stopping.

    def start(self):
        flags = ["--host=127.0.0.1", f"--mode={self.mode}",
                 f"--worker_timeout={WORKER_TIMEOUT:g}s"]
        if self.elastic:
            flags.append("--elastic")
        binary = os.path.join(self.args.bin, "ps_server")
        try:
            if self.replicated:
                self.etcd_argv, endpoint = etcd_argv(self.dir)
                self.etcd = start_etcd(self.dir, self.etcd_argv)
                flags += ["--replicas=2", f"--etcd={endpoint}",
                          f"--job=history{self.seed}",
                          f"--lease_ttl={LEASE:g}s"]
                for s in range(SHARDS):
                    for m in range(2):
                        self._member(binary, s, m, flags)
            else:
                ckpt = os.path.join(self.dir, "ckpt")
                os.makedirs(ckpt)
                flags += [f"--checkpoint_dir={ckpt}", "--checkpoint_every=500ms"]
                for s in range(SHARDS):
                    self._member(binary, s, None, flags)
        except cluster.ShardFailed as e:
            raise JobFailed(str(e))
        self.t0 = time.time()
        for r in range(WORKERS):
            self.start_worker(r)

    def _member(self, binary, s, m, flags):
        name = f"server{s}" + (f"-{m}" if m is not None else "")
        ready = os.path.join(self.dir, name)
        os.makedirs(ready, exist_ok=True)
        log = open(os.path.join(self.dir, name + ".log"), "a")
        self._logs.append(log)
        extra = []
        port = 0
        if m is not None:
            port = free_port()
            extra = [f"--advertise=127.0.0.1:{port}"]
            if m == 0:
                extra.append("--bootstrap")  # Creates the group; dropped
                # from the flags after (cluster.Shard.start).
        shard = cluster.Shard(binary, s, SHARDS, flags + extra, log, ready)
        shard.port = port
        shard.log_path = log.name
        shard.start()
        self.members.append((s, shard))

    @property
    def servers(self):
        groups = {}
        for s, m in self.members:
            groups.setdefault(s, []).append(m.address)
        return ",".join("|".join(groups[s]) for s in sorted(groups))

    def start_worker(self, rank):
        env = dict(os.environ, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([self.pypath, HERE]))
        with open(os.path.join(self.dir, f"worker{rank}.log"), "a") as log:
            self.workers[rank] = subprocess.Popen(
                ["/usr/bin/python3", os.path.join(HERE, "history_worker.py"),
                 f"--servers={self.servers}", f"--rank={rank}",
                 f"--workers={WORKERS}", f"--mode={self.mode}",
                 f"--dir={self.dir}", f"--seed={self.seed}"] +
                (["--rows"] if self.rows else []) +
                ([f"--slots={hw.ELEMS // 4}", "--elastic"]
                 if self.elastic else []),
                stdout=log, stderr=log, env=env)

    def finish(self, wait=90.0):
        """Stops the faults' aftermath: every worker finishes its step and
        leaves; JobFailed if one does not within `wait` seconds."""
        open(os.path.join(self.dir, "stop"), "w").close()
        deadline = time.monotonic() + wait
        for r, w in self.workers.items():
            try:
                w.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                raise JobFailed(f"worker {rank_text(r)} did not finish within "
                                f"{wait:g} s of the stop")

    def stop(self):
        for w in self.workers.values():
            if w.poll() is None:
                w.kill()
            w.wait()
        for s, m in self.members:
            # The faults restart every member they kill: one found exited
            # here ended by itself (a crash, or a member giving up), said
            # in its log and on stderr with its status.
            if m.proc is not None and m.proc.poll() is not None:
                note = (f"history_check: member {m.address} of shard {s} "
                        f"(pid {m.proc.pid}) exited by itself, status "
                        f"{m.proc.returncode}")
                print(note, file=sys.stderr, flush=True)
                with open(m.log_path, "a") as log:
                    log.write(note + "\n")
            if m.proc is not None and m.proc.poll() is None:
                m.proc.send_signal(signal.SIGCONT)
            m.kill()
        if self.etcd is not None:
            self.etcd.kill()
            self.etcd.wait()
        for log in self._logs:
            log.close()

    # What the run left.

    def journals(self):
        out = {}
        for path in glob.glob(os.path.join(self.dir, "journal-*.jsonl")):
            rank, gen = re.search(r"journal-(\d+)-(\d+)", path).groups()
            out[(int(rank), int(gen))] = hw.read_journal(path)
        return out

    def rows_used(self):
        if not self.rows:
            return set()
        ids = set()
        for events in self.journals().values():
            for ev in events:
                if ev.get("ev") == "send":
                    ids.update(hw.row_ids(ev["slot"]))
        return ids

    def model_config(self):
        return {"mode": self.mode, "workers": WORKERS, "shards": SHARDS,
                "replicated": self.replicated, "t0": self.t0,
                "worker_timeout": WORKER_TIMEOUT, "elastic": self.elastic}

    # Faults.

    def inject(self, rng, seconds, every):
        kinds = (["primary_kill", "backup_kill", "primary_stop",
                  "etcd_restart", "worker_kill", "drop_conn"]
                 if self.replicated else
                 ["shard_kill", "worker_kill", "drop_conn"])
        if self.elastic:
            kinds = kinds + ["worker_join", "worker_leave"] * 2
        until = time.monotonic() + seconds
        while time.monotonic() + every < until:
            time.sleep(every)  # The pace of the faults, not a sync.
            self.revive()
            kind = rng.choice(kinds)
            if kind == "worker_kill":
                self.worker_kill(rng.randrange(WORKERS))
            elif kind == "drop_conn":
                self.drop_conn(rng.randrange(WORKERS), rng.randrange(SHARDS))
            elif kind in ("worker_join", "worker_leave"):
                self.join_or_leave(rng.choice(JOINERS))
            elif kind == "shard_kill":
                self.shard_kill(rng.randrange(SHARDS))
            elif kind == "etcd_restart":
                self.etcd_restart()
            else:
                self.member_fault(kind, rng.randrange(SHARDS))
        remaining = until - time.monotonic()
        if remaining > 0:
            time.sleep(remaining)
        self.revive()

    def revive(self):
        """A worker that gave up (exit status not 0) is noted and started
        again, so the run goes on."""
        for r, w in self.workers.items():
            if w.poll() not in (None, 0):
                self.faults.append({"t": time.time(), "kind": "worker_exit",
                                    "rank": r, "end": time.time(),
                                    "status": w.returncode})
                self.start_worker(r)

    def join_or_leave(self, rank):
        """Elastic runs: starts `rank` if it is not running, else SIGTERMs
        it (it leaves the job after its step) and waits for it."""
        t = time.time()
        w = self.workers.get(rank)
        if w is None or w.poll() is not None:
            self.start_worker(rank)
            kind = "worker_join"
        else:
            w.send_signal(signal.SIGTERM)
            try:
                w.wait(timeout=60)
            except subprocess.TimeoutExpired:
                raise JobFailed(f"worker {rank} did not leave within 60 s "
                                "of its SIGTERM")
            kind = "worker_leave"
        self.faults.append({"t": t, "kind": kind, "rank": rank,
                            "end": time.time()})

    def worker_kill(self, rank):
        t = time.time()
        self.workers[rank].kill()
        self.workers[rank].wait()
        self.start_worker(rank)
        self.faults.append({"t": t, "kind": "worker_kill", "rank": rank,
                            "end": time.time()})

    def shard_kill(self, s):
        shard = next(m for i, m in self.members if i == s)
        ckpt = os.path.join(self.dir, "ckpt")
        deadline = time.monotonic() + 5.0
        while (not glob.glob(os.path.join(ckpt, f"shard-{s}-*")) and
               time.monotonic() < deadline):
            time.sleep(0.05)  # No restart before a first checkpoint.
        offset = os.path.getsize(shard.log_path)
        t = time.time()
        shard.kill()
        killed = time.time()  # SIGKILLed and reaped: no call reaches it.
        try:
            shard.start()
        except cluster.ShardFailed as e:
            raise JobFailed(f"shard {s} did not restart: {e}")
        self.faults.append({"t": t, "kind": "shard_kill", "shard": s,
                            "killed": killed, "end": time.time(),
                            "ckpt": restored_at(shard.log_path, offset)})

    def member_fault(self, kind, s):
        roles = self.wait_in_sync(s)
        if roles is None:
            return  # The group has no backup in sync: no safe fault now.
        want = "backup" if kind == "backup_kill" else "primary"
        member = next(m for i, m in self.members
                      if i == s and roles.get(m.address) == want)
        t = time.time()
        if kind == "primary_stop":
            member.proc.send_signal(signal.SIGSTOP)
            time.sleep(2.5 * LEASE)
            member.proc.send_signal(signal.SIGCONT)
        else:
            member.kill()
            try:
                member.start()
            except cluster.ShardFailed as e:
                raise JobFailed(f"member of shard {s} did not restart: {e}")
        self.faults.append({"t": t, "kind": kind, "shard": s,
                            "member": member.address, "end": time.time()})

    def etcd_restart(self):
        """SIGKILL etcd and start it again on its ports with its data after
        2.5 leases: every primary's lease runs out meanwhile (it fences
        itself; ps_server starts a fresh member), and once etcd is back the
        backups in `insync` are elected."""
        t = time.time()
        self.etcd.kill()
        self.etcd.wait()
        time.sleep(2.5 * LEASE)  # An outage longer than a lease.
        self.etcd = start_etcd(self.dir, self.etcd_argv)
        self.faults.append({"t": t, "kind": "etcd_restart", "shard": None,
                            "end": time.time()})

    def wait_in_sync(self, s, wait=15.0):
        """{address: role} of group `s` once its primary has the other
        member as a backup, or None after `wait` seconds."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            roles, backups = self.group_status(s)
            primaries = [a for a, r in roles.items() if r == "primary"]
            others = [a for a, r in roles.items() if r == "backup"]
            if (len(primaries) == 1 and len(others) == 1 and
                    others[0] in backups.get(primaries[0], "")):
                return roles
            time.sleep(0.2)
        return None

    def group_status(self, s):
        out = subprocess.run(
            [os.path.join(self.args.bin, "psctl"), f"--servers={self.servers}",
             "--timeout=2s", "status"],
            capture_output=True, text=True, timeout=20).stdout
        roles, backups = {}, {}
        for line in out.splitlines():
            f = line.split()
            if len(f) >= 3 and f[0] == str(s) and re.fullmatch(
                    r"[0-9.]+:[0-9]+", f[1]):
                roles[f[1]] = f[2]
                backups[f[1]] = f[-1] if len(f) >= 8 else ""
        return roles, backups

    def drop_conn(self, rank, s):
        """Closes worker `rank`'s connections to shard `s` (every member)."""
        ports = set()
        for i, m in self.members:
            if i == s and m.ready:
                ports.update({int(m.ready["port"]),
                              int(m.ready.get("data_port", 0))})
        pid = self.workers[rank].pid
        t = time.time()
        listing = subprocess.run(["ss", "-tnpH", "state", "established"],
                                 capture_output=True, text=True).stdout
        killed = 0
        for line in listing.splitlines():
            f = line.split()
            if len(f) < 4 or f"pid={pid}," not in line:
                continue
            local, peer = f[-3], f[-2]
            if int(peer.rsplit(":", 1)[1]) not in ports:
                continue
            r = subprocess.run(["ss", "-K", "-tn", "src", local, "dst", peer],
                               capture_output=True, text=True)
            killed += r.returncode == 0
        self.faults.append({"t": t, "kind": "drop_conn", "rank": rank,
                            "shard": s, "end": time.time(),
                            "closed": killed})


def rank_text(r):
    return str(r)
