"""Other hosts for asyncps.run -H: where each shard and worker runs, and
the processes that run them there over ssh.

    hosts = parse_hosts("h1:2,h2:2")          # or read_hostfile(path)
    workers, shards = place(hosts, workers=4, shards=2)
    p = Remote("h1", ssh, ["python3", "train.py"], env, "[h1:0] ")

Every process runs under one POSIX sh script (`wrap`) on its host, started
by `ssh HOST sh -c SCRIPT` (or `sh -c SCRIPT` for localhost): the script
cds to the launcher's directory, runs the command with the job's
environment, and sends it SIGTERM once its ssh's stdin closes. So closing
that pipe stops the process on its host (a ps_server drains first), and so
does the launcher dying, or ssh's connection breaking: nothing is left
running on any host. A shard's script prints one line, `ASYNCPS_READY`
and its ready file's JSON, once it serves: its port, chosen by its host's
kernel. Needs only the standard library.
"""

import json
import os
import re
import shlex
import subprocess
import sys
import threading
import time

from asyncps.cluster import ShardFailed

LOCAL = ("localhost", "127.0.0.1")
READY = "ASYNCPS_READY "

# Variables that describe this login, not the job: the remote login sets
# its own.
_NOT_PASSED = {"HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD", "SHLVL",
               "_", "HOSTNAME", "TERM", "DISPLAY", "MAIL", "TMPDIR",
               "MOTD_SHOWN", "LS_COLORS"}
_NOT_PASSED_PREFIXES = ("SSH_", "XDG_", "BASH_FUNC_")
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _host_and_slots(text, where):
    """One host's entry, "host", "host:N" or (a hostfile's) "host slots=N",
    as (host, N). A host is a name or an IPv4 address (not IPv6: its
    colons would read as slots)."""
    m = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)"
                     r"(?::(\d+)|\s+slots\s*=\s*(\d+))?\s*", text)
    if m is None:
        raise ValueError(f"{where}: '{text.strip()}' is not host, host:N "
                         "or host slots=N")
    slots = int(m.group(2) or m.group(3) or 1)
    if slots < 1:
        raise ValueError(f"{where}: '{text.strip()}' has no slots")
    return m.group(1), slots


def parse_hosts(spec):
    """-H's "h1:2,h2:2" as [("h1", 2), ("h2", 2)] (one slot when no :N)."""
    entries = [e for e in spec.split(",") if e.strip()]
    if not entries:
        raise ValueError(f"-H '{spec}' names no host")
    return [_host_and_slots(e, "-H") for e in entries]


def read_hostfile(path):
    """A hostfile's lines, "host slots=N" (horovodrun's and MPI's) or
    "host:N"; '#' starts a comment."""
    hosts = []
    with open(path) as f:
        for number, line in enumerate(f, 1):
            line = line.split("#", 1)[0]
            if line.strip():
                hosts.append(_host_and_slots(line, f"{path}:{number}"))
    if not hosts:
        raise ValueError(f"hostfile {path} names no host")
    return hosts


def place(hosts, workers, shards):
    """Workers fill the hosts' slots in order (ranks 0..N-1 on the first
    host, ...); shard i runs on host i % len(hosts). Returns ([(host,
    local_rank, local_world_size)] by rank, [host] by shard)."""
    total = sum(slots for _, slots in hosts)
    if workers > total:
        raise ValueError(f"{workers} workers do not fit the hosts' {total} "
                         "slots")
    by_rank = []
    for host, slots in hosts:
        here = min(slots, workers - len(by_rank))
        by_rank += [(host, i, here) for i in range(here)]
    return by_rank, [hosts[i % len(hosts)][0] for i in range(shards)]


def passed_env(env):
    """The launcher's environment as the job gets it on every host: all of
    it but what describes this login (HOME, USER, SSH_*, ...)."""
    return {k: v for k, v in env.items()
            if _NAME.match(k) and k not in _NOT_PASSED
            and not k.startswith(_NOT_PASSED_PREFIXES)}


def wrap(command, env, cwd, ready_flag=None):
    """The sh script that runs `command` (a list) on its host, as the
    module's doc says. With `ready_flag` (e.g. "--ready_file="), the
    command also gets that flag naming a file in a fresh directory, and the
    script prints READY and the file once it is there."""
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    run = " ".join(shlex.quote(c) for c in command)
    if ready_flag:
        run += " " + shlex.quote(ready_flag) + '"$d/ready.json"'
    lines = [
        f"cd {shlex.quote(cwd)} 2>/dev/null || cd",
        'd=$(mktemp -d) || exit 127',
        "exec 3<&0",
        f"env {exports} {run} </dev/null 3<&- &",
        "c=$!",
        # Stops the command once ssh's stdin closes (the launcher is done
        # with it, gone, or cut off).
        '{ cat <&3 >/dev/null 2>&1; kill -TERM "$c" 2>/dev/null; } &',
        "k=$!",
        "exec 3<&-",
    ]
    if ready_flag:
        lines += [
            'while [ ! -s "$d/ready.json" ] && kill -0 "$c" 2>/dev/null; do '
            "sleep 0.05; done",
            f'[ -s "$d/ready.json" ] && echo "{READY}$(cat "$d/ready.json")"',
        ]
    lines += ['wait "$c"; s=$?', 'kill "$k" 2>/dev/null',
              'rm -rf "$d"', 'exit "$s"']
    return "\n".join(lines)


def ssh_command(host, ssh):
    """What starts a script on `host`: sh here for localhost, else ssh
    with `ssh` (a list of ssh's options) in batch mode."""
    if host in LOCAL:
        return ["sh", "-c"]
    return ["ssh", "-o", "BatchMode=yes", "-o", "LogLevel=ERROR", *ssh,
            host, "sh", "-c"]


_print_lock = threading.Lock()


class Remote:
    """One process on a host, its output streamed line by line with
    `prefix` to `out` (this process's stdout by default). `proc` is the
    local ssh (or sh), whose exit status is the process's."""

    def __init__(self, host, ssh, command, env, prefix, out=None,
                 ready_flag=None):
        script = wrap(command, env, os.getcwd(), ready_flag)
        quoted = ([shlex.quote(script)] if host not in LOCAL else [script])
        self.ready = None  # A shard's ready file, once it serves.
        self._ready_seen = threading.Event()
        self._prefix, self._out = prefix, out
        # A session of its own: a Ctrl-C reaches the launcher only, which
        # then stops each process in order.
        self.proc = subprocess.Popen(
            [*ssh_command(host, ssh), *quoted], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            start_new_session=True)
        self._pump = threading.Thread(target=self._stream, daemon=True)
        self._pump.start()

    @property
    def pid(self):
        return self.proc.pid

    def _stream(self):
        for raw in self.proc.stdout:
            line = raw.decode(errors="replace")
            if line.startswith(READY) and self.ready is None:
                try:
                    self.ready = json.loads(line[len(READY):])
                except ValueError:
                    pass
                self._ready_seen.set()
                continue
            out = self._out or sys.stdout
            with _print_lock:
                out.write(self._prefix + line)
                out.flush()
        self._ready_seen.set()

    def wait_ready(self, timeout):
        """The ready file's JSON, or None if the process ended first or
        `timeout` passed."""
        self._ready_seen.wait(timeout)
        return self.ready

    def poll(self):
        return self.proc.poll()

    def stop(self, grace=10.0):
        """Closes its stdin (its host's script sends it SIGTERM: a shard
        drains), waits up to `grace`, then kills the local ssh (the remote
        script sees its stdin close all the same)."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        if self.proc.returncode is None:
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()
        self._pump.join(timeout=grace)

    def kill(self):
        """Stops it (SIGTERM on its host), without waiting long."""
        self.stop(grace=5.0)

    def wait(self):
        """Its exit status, once its output has all been written."""
        status = self.proc.wait()
        self._pump.join(timeout=10)
        return status


class RemoteShard:
    """A ps_server on another host, with cluster.Shard's interface (start,
    stop, kill, proc, index, address), listening on all its addresses and
    reached at `host`."""

    def __init__(self, binary, index, count, flags, host, ssh, env, out,
                 timeout=60.0):
        self.binary, self.index, self.count = binary, index, count
        self.flags, self.host, self.ssh = list(flags), host, ssh
        self.env, self.out, self.timeout = env, out, timeout
        self.port = 0
        self.remote = None
        self.proc = None

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def start(self):
        bind = "127.0.0.1" if self.host in LOCAL else "0.0.0.0"
        command = [self.binary, f"--host={bind}", f"--port={self.port}",
                   f"--shard={self.index}", f"--num_shards={self.count}",
                   *self.flags]
        self.remote = Remote(self.host, self.ssh, command, self.env,
                             f"[{self.host}:shard{self.index}] ", self.out,
                             ready_flag="--ready_file=")
        self.proc = self.remote.proc
        deadline = time.monotonic() + self.timeout
        ready = self.remote.wait_ready(self.timeout)
        if ready is None:
            if time.monotonic() >= deadline:
                self.remote.kill()
                raise ShardFailed(f"shard {self.index} on {self.host} did "
                                  f"not serve within {self.timeout:.0f} s")
            status = self.proc.wait()
            raise ShardFailed(f"shard {self.index} on {self.host} exited "
                              f"with status {status} before serving")
        self.port = int(ready["port"])
        if "--bootstrap" in self.flags:
            self.flags.remove("--bootstrap")
        return self

    def stop(self, grace=10.0):
        if self.remote is not None:
            self.remote.stop(grace)

    def kill(self):
        if self.remote is not None:
            self.remote.kill()
