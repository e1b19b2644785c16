"""python3 -m asyncps.run -H for real: three emulated hosts (network
namespaces from deploy/netem_cluster.sh, each with its own address and an
sshd of its own); the launcher runs on the first and starts shards and
workers on the other two over ssh. Run by launcher_hosts_test.sh, inside
netem_cluster.sh (NETEM_HOSTS, NETEM_ADDRS), as root.

Checks: a bsp job from a hostfile places ranks and shards by slots, passes
the environment and the script's arguments through, prefixes each line
with host:rank, and every rank ends on the same weights; a worker killed
once is started again on its host; a worker that fails past
--max_restarts stops the job with its status; a Ctrl-C stops it; -H names
a bad entry; and after each run nothing but sshd is left on any host.
"""

import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

HOSTS = os.environ["NETEM_HOSTS"].split()
ADDRS = os.environ["NETEM_ADDRS"].split()
SERVER = os.environ["ASYNCPS_PS_SERVER"]

WORKER = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    import asyncps
    out, how = sys.argv[1], sys.argv[2]
    client = asyncps.Client()
    rank = client.rank
    here = os.environ["SSH_CONNECTION"].split()[2]  # This host's address.
    client.declare({"w": np.zeros(3, np.float32)}, optimizer="sgd", lr=0.5)
    marker = os.path.join(out, "killed")
    if how == "hang":
        print("ready", flush=True)
        time.sleep(600)
    if how == "fail" and rank == 3:
        sys.exit(3)
    for step in range(8):
        if how == "die-once" and rank == 2 and step == 3 \\
                and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        w = client.push_pull({"w": np.full(3, rank + 1, np.float32)})["w"]
    with open(os.path.join(out, f"rank{rank}"), "w") as f:
        f.write(" ".join([here, os.environ["LOCAL_RANK"],
                          os.environ["LOCAL_WORLD_SIZE"],
                          os.environ["WORLD_SIZE"],
                          os.environ["ASYNCPS_SERVERS"],
                          os.environ.get("LAUNCHER_MARK", "-"),
                          ",".join(str(x) for x in w)]))
    print(f"done rank {rank}", flush=True)
    client.leave()
""")

FAILED = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILED.append(what)


def ssh_args(tmp):
    return ["-i", f"{tmp}/id", "--ssh_option", "StrictHostKeyChecking=no",
            "--ssh_option", "UserKnownHostsFile=/dev/null"]


def start_sshd(tmp):
    """An sshd on each host but the launcher's, taking only tmp/id."""
    for key in ("id", "host"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "",
                        "-f", f"{tmp}/{key}"], check=True)
    os.rename(f"{tmp}/id.pub", f"{tmp}/authorized_keys")
    os.makedirs("/run/sshd", exist_ok=True)  # sshd's privilege separation.
    for ns, addr in zip(HOSTS[1:], ADDRS[1:]):
        subprocess.Popen(
            ["ip", "netns", "exec", ns, "/usr/sbin/sshd", "-D", "-e",
             "-f", "/dev/null", "-o", f"ListenAddress={addr}",
             "-o", f"HostKey={tmp}/host",
             "-o", f"AuthorizedKeysFile={tmp}/authorized_keys",
             "-o", "StrictModes=no", "-o", "UsePAM=no",
             "-o", "PasswordAuthentication=no", "-o", "PidFile=none",
             "-o", "PermitRootLogin=prohibit-password"],
            stdout=subprocess.DEVNULL, stderr=open(f"{tmp}/sshd.log", "a"))
    for addr in ADDRS[1:]:  # Until each answers (at most 10 s).
        deadline = time.monotonic() + 10
        while subprocess.run(
                ["ip", "netns", "exec", HOSTS[0], "ssh", "-o",
                 "BatchMode=yes", "-o", "ConnectTimeout=1", "-i",
                 f"{tmp}/id", "-o", "StrictHostKeyChecking=no", "-o",
                 "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                 addr, "true"], capture_output=True).returncode != 0:
            if time.monotonic() > deadline:
                raise SystemExit(f"sshd on {addr} did not answer: "
                                 + open(f"{tmp}/sshd.log").read())
            time.sleep(0.05)


def leftovers():
    """What runs on the hosts besides sshd, after the processes there have
    had up to 10 s to finish closing their sessions."""
    deadline = time.monotonic() + 10
    while True:
        left = []
        for ns in HOSTS:
            pids = subprocess.run(["ip", "netns", "pids", ns],
                                  capture_output=True, text=True).stdout
            for pid in pids.split():
                try:
                    comm = open(f"/proc/{pid}/comm").read().strip()
                except OSError:
                    continue
                if comm != "sshd":
                    left.append(f"{ns}:{pid}:{comm}")
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def launcher(tmp, out, how, *flags, **popen):
    return subprocess.Popen(
        ["ip", "netns", "exec", HOSTS[0], sys.executable, "-m",
         "asyncps.run", "--ps_server", SERVER, *ssh_args(tmp), *flags, "--",
         f"{tmp}/train.py", out, how],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, LAUNCHER_MARK="passed"), **popen)


def run(tmp, name, how, *flags):
    out = tempfile.mkdtemp(prefix=name, dir=tmp)
    p = launcher(tmp, out, how, *flags)
    text, _ = p.communicate(timeout=120)
    return p.returncode, text, out


def test_a_job_across_hosts(tmp):
    with open(f"{tmp}/hostfile", "w") as f:
        f.write(f"# two hosts\n{ADDRS[1]} slots=2\n{ADDRS[2]}:2\n")
    status, text, out = run(tmp, "job", "ok", "--hostfile", f"{tmp}/hostfile",
                            "--shards", "2", "--mode", "bsp")
    check(status == 0, f"a bsp job on two hosts exits 0 (got {status}):\n"
          + text[-3000:])
    seen = {}
    for rank in range(4):
        path = os.path.join(out, f"rank{rank}")
        seen[rank] = open(path).read().split() if os.path.exists(path) else []
    check(all(len(v) == 7 for v in seen.values()), f"every rank wrote {seen}")
    if not all(len(v) == 7 for v in seen.values()):
        return
    want_hosts = [ADDRS[1], ADDRS[1], ADDRS[2], ADDRS[2]]
    check([seen[r][0] for r in range(4)] == want_hosts,
          f"ranks fill the slots in order: {[seen[r][0] for r in range(4)]}")
    check([seen[r][1:4] for r in range(4)] ==
          [["0", "2", "4"], ["1", "2", "4"], ["0", "2", "4"],
           ["1", "2", "4"]], "LOCAL_RANK, LOCAL_WORLD_SIZE, WORLD_SIZE")
    servers = seen[0][4].split(",")
    check([s.rsplit(":", 1)[0] for s in servers] == ADDRS[1:3],
          f"shard i on host i: {servers}")
    check(all(seen[r][5] == "passed" for r in range(4)),
          "the launcher's environment reaches every host")
    # bsp: each of the 8 steps applies the mean of the ranks' gradients
    # (rank + 1 each) with lr 0.5, and every rank's last pull is step 8's.
    want = -0.5 * 8 * sum(r + 1 for r in range(4)) / 4
    check(all(seen[r][6] == ",".join([str(want)] * 3) for r in range(4)),
          f"every rank ends on the weights of 8 steps, {want}: "
          f"{[seen[r][6] for r in range(4)]}")
    for rank, host in enumerate(want_hosts):
        check(f"[{host}:{rank}] done rank {rank}" in text,
              f"rank {rank}'s line comes prefixed with {host}:{rank}")
    check(f"[{ADDRS[2]}:shard1] " in text, "shard 1's log is prefixed")
    check(not leftovers(), f"nothing left on the hosts: {leftovers()}")


def test_a_killed_worker_starts_again_on_its_host(tmp):
    status, text, out = run(tmp, "die", "die-once", "-H",
                            f"{ADDRS[1]}:2,{ADDRS[2]}:2", "--max_restarts",
                            "1", "--log_dir", f"{tmp}/logs")
    # Its host's sh reports a SIGKILL as 137, and ssh passes that on.
    check(status == 0 and "worker 2 failed (137); starting it again (1/1)"
          in text, f"a worker killed once is started again:\n{text[-3000:]}")
    check(os.path.exists(os.path.join(out, "rank2"))
          and open(os.path.join(out, "rank2")).read().startswith(ADDRS[2]),
          "rank 2 finished on its host")
    check("shard0]" not in text and os.path.getsize(f"{tmp}/logs/shard0.log")
          > 0, "--log_dir takes the shards' output")
    check(not leftovers(), f"nothing left on the hosts: {leftovers()}")


def test_a_failure_past_the_restarts_stops_everything(tmp):
    status, text, _ = run(tmp, "fail", "fail", "-H",
                          f"{ADDRS[1]}:2,{ADDRS[2]}:2", "--max_restarts", "0")
    check(status == 3 and "worker 3 failed (3) and --max_restarts=0 are "
          "used up" in text, f"exits with the worker's status:\n{text[-2000:]}")
    check(not leftovers(), f"nothing left on the hosts: {leftovers()}")


def test_ctrl_c_stops_everything(tmp):
    out = tempfile.mkdtemp(prefix="hang", dir=tmp)
    # As from a terminal: this test runs in the background of a script,
    # where SIGINT is ignored, and children would inherit that.
    p = launcher(tmp, out, "hang", "-H", f"{ADDRS[1]}:1,{ADDRS[2]}:1",
                 "--shards", "2", preexec_fn=lambda: signal.signal(
                     signal.SIGINT, signal.SIG_DFL))
    lines = []
    for line in p.stdout:  # Until both workers are up.
        lines.append(line)
        if sum("] ready" in x for x in lines) == 2:
            break
    p.send_signal(signal.SIGINT)
    rest, _ = p.communicate(timeout=60)
    check(p.returncode == 130 and "interrupted; stopping everything" in rest,
          f"a Ctrl-C exits 130 ({p.returncode}):\n{''.join(lines)}{rest}")
    check(not leftovers(), f"nothing left on the hosts: {leftovers()}")


def test_bad_hosts_are_named(tmp):
    status, text, _ = run(tmp, "bad", "ok", "-H", f"{ADDRS[1]}:x")
    check(status == 2 and f"'{ADDRS[1]}:x' is not host" in text,
          f"a bad -H entry is named: {text[-500:]}")
    status, text, _ = run(tmp, "many", "ok", "-H", f"{ADDRS[1]}:1",
                          "--workers", "2")
    check(status != 0 and "2 workers do not fit the hosts' 1 slots" in text,
          f"too many workers are refused: {text[-500:]}")


def main():
    with tempfile.TemporaryDirectory(prefix="hosts") as tmp:
        os.chmod(tmp, 0o755)
        with open(f"{tmp}/train.py", "w") as f:
            f.write(WORKER)
        start_sshd(tmp)
        for test in (test_bad_hosts_are_named, test_a_job_across_hosts,
                     test_a_killed_worker_starts_again_on_its_host,
                     test_a_failure_past_the_restarts_stops_everything,
                     test_ctrl_c_stops_everything):
            print(f"== {test.__name__}", flush=True)
            test(tmp)
    print(f"{len(FAILED)} failed", flush=True)
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
