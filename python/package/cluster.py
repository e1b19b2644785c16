"""Shards for a job on this machine: the one launcher of ps_server
processes that asyncps.run, the Python tests and tools/experiments/experiment.py
share.

    shards = Shards(binary, mode="async")
    servers = shards.start(2, "--checkpoint_dir=/tmp/ckpt")  # ["h:p", ...]
    shards.restart(1)       # SIGKILL and start again on the same port
    shards.stop()           # SIGTERM (drained), SIGKILL after a grace

Each shard runs on 127.0.0.1 with a port the kernel picks and says when it
serves by writing its --ready_file (JSON: shard, port, data_port, pid);
nothing reads its log to find that out. Needs only the standard library
(tools import this file by path, without the compiled module).

From a shell (the bash tools use this; nothing else starts shards):

    python3 -m asyncps.cluster --ps_server BIN --shards 2 -- CMD ARGS
        # runs CMD with $ASYNCPS_SERVERS set and "{servers}" in ARGS
        # replaced, stops the shards, exits with CMD's status
    python3 -m asyncps.cluster --ps_server BIN --shards 2 &
        # prints the servers line once all serve; stops them on SIGTERM
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time


class ShardFailed(RuntimeError):
    """A shard exited before it served."""


def read_result(path):
    """The JSON a ps_worker --result_json (or ps_server --ready_file)
    wrote, or None if there is none."""
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


class Shard:
    """One ps_server process; `start` returns once it serves."""

    def __init__(self, binary, index, count, flags, log, ready_dir,
                 timeout=30.0, host="127.0.0.1", netns=None):
        """`ready_dir` (the caller's, and the caller removes it) holds the
        ready file; `log` (a file, or None) gets the shard's stderr. With
        `netns`, the shard runs in that network namespace (`ip netns exec`,
        as deploy/netem_cluster.sh makes them), listening on `host`."""
        self.binary, self.index, self.count = binary, index, count
        self.host, self.netns = host, netns
        self.flags, self.log, self.timeout = list(flags), log, timeout
        self.ready_dir = ready_dir
        self.port = 0
        self.ready = None  # What its ready file said.
        self.proc = None

    @property
    def address(self):
        return f"{self.host}:{self.port}"

    def start(self):
        ready = os.path.join(self.ready_dir, f"shard{self.index}.json")
        if os.path.exists(ready):
            os.remove(ready)
        inside = ["ip", "netns", "exec", self.netns] if self.netns else []
        self.proc = subprocess.Popen(
            [*inside, self.binary, f"--host={self.host}", f"--port={self.port}",
             f"--shard={self.index}", f"--num_shards={self.count}",
             f"--ready_file={ready}", *self.flags],
            stdout=subprocess.DEVNULL, stderr=self.log or subprocess.DEVNULL)
        # The file appears (renamed into place, whole) once it serves; the
        # process exiting first is a failure, not a wait.
        deadline = time.monotonic() + self.timeout
        while True:
            self.ready = read_result(ready)
            if self.ready is not None:
                break
            if self.proc.poll() is not None:
                raise ShardFailed(f"shard {self.index} exited with status "
                                  f"{self.proc.returncode} before serving")
            if time.monotonic() > deadline:
                self.kill()
                raise ShardFailed(f"shard {self.index} did not serve within "
                                  f"{self.timeout:.0f} s")
            time.sleep(0.02)
        self.port = int(self.ready["port"])
        # A first start's flag (a replicated group's creation): a restart
        # must never create the group again (ps_server --help).
        if "--bootstrap" in self.flags:
            self.flags.remove("--bootstrap")
        return self

    def stop(self, grace=10.0):
        """SIGTERM (the shard drains and writes its last checkpoint), then
        SIGKILL after `grace` seconds."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.proc.wait()

    def kill(self):
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()


class Shards:
    """The shards of one job."""

    def __init__(self, binary, mode=None, log=None, ready_dir=None,
                 log_dir=None):
        """Without `ready_dir` the ready files go to a temporary directory
        that stop() and kill() remove. Shard i's stderr goes to `log` (a
        file), or with `log_dir` to log_dir/server<i>.log."""
        self.binary, self.mode, self.log = binary, mode, log
        self.log_dir = log_dir
        self.own_dir = ready_dir is None
        self.ready_dir = ready_dir or tempfile.mkdtemp(prefix="asyncps-")
        self.shards = []
        self._logs = []  # The files opened for log_dir.

    @property
    def servers(self):
        return ",".join(s.address for s in self.shards)

    def start(self, n, *flags, metrics_base=0, netns=None):
        """Starts `n` shards with `flags` (and --mode, if given; with
        `metrics_base` > 0, shard i serves /metrics on metrics_base + i);
        returns their addresses, ["host:port", ...] (`servers` joins
        them). `netns`: a (namespace, address) per shard to run it in."""
        mode = [f"--mode={self.mode}"] if self.mode else []
        for i in range(n):
            metrics = ([f"--metrics_port={metrics_base + i}"]
                       if metrics_base > 0 else [])
            log = self.log
            if self.log_dir:
                log = open(os.path.join(self.log_dir, f"server{i}.log"), "a")
                self._logs.append(log)
            where = {}
            if netns:
                where = {"netns": netns[i][0], "host": netns[i][1]}
            shard = Shard(self.binary, i, n, [*mode, *flags, *metrics], log,
                          self.ready_dir, **where)
            self.shards.append(shard)
            shard.start()
        return [s.address for s in self.shards]

    def restart(self, index, *flags):
        """SIGKILLs shard `index` and starts it again on its port (with
        other `flags`, if given)."""
        shard = self.shards[index]
        shard.kill()
        if flags:
            mode = [f"--mode={self.mode}"] if self.mode else []
            shard.flags = [*mode, *flags]
        shard.start()

    def stop(self):
        for s in self.shards:
            s.stop()
        self._release()

    def kill(self):
        for s in self.shards:
            s.kill()
        self._release()

    def _release(self):
        """Closes the log files it opened; removes its own ready directory."""
        for log in self._logs:
            log.close()
        self._logs = []
        if self.own_dir:
            shutil.rmtree(self.ready_dir, ignore_errors=True)


def _parse(argv):
    cut = argv.index("--") if "--" in argv else len(argv)
    ours, command = argv[:cut], argv[cut + 1:]
    p = argparse.ArgumentParser(
        prog="python3 -m asyncps.cluster",
        description="Starts ps_server shards on 127.0.0.1 and prints "
        "host:port,... once all serve; then runs the command after -- and "
        "stops them, or, without one, stops them on SIGTERM or SIGINT.")
    p.add_argument("--ps_server", required=True, help="the ps_server binary")
    p.add_argument("--shards", type=int, default=1)
    p.add_argument("--mode", default=None)
    p.add_argument("--log_dir", default="",
                   help="shard i's stderr to DIR/server<i>.log")
    p.add_argument("--metrics_base", type=int, default=0,
                   help="shard i serves /metrics on this port + i (0: none)")
    p.add_argument("--server_flag", action="append", default=[],
                   help="one more flag for every shard (repeatable)")
    p.add_argument("--netns", default="",
                   help="NS=ADDR,... : shard i runs in network namespace NS "
                   "listening on ADDR (deploy/netem_cluster.sh's hosts)")
    args = p.parse_args(ours)
    if args.shards < 1:
        p.error("--shards must be >= 1")
    args.hosts = []
    for item in filter(None, args.netns.split(",")):
        ns, _, addr = item.partition("=")
        if not ns or not addr:
            p.error(f"--netns entry '{item}': want NS=ADDR")
        args.hosts.append((ns, addr))
    if args.hosts and len(args.hosts) != args.shards:
        p.error(f"--netns names {len(args.hosts)} hosts for "
                f"{args.shards} shards")
    return args, command


class _Stop(Exception):
    """SIGTERM or SIGINT reached the launcher."""


def _stop(signum, frame):
    raise _Stop()


def main(argv=None):
    args, command = _parse(sys.argv[1:] if argv is None else argv)
    shards = Shards(args.ps_server, mode=args.mode,
                    log_dir=args.log_dir or None)
    child = None
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, _stop)
    try:
        shards.start(args.shards, *args.server_flag,
                     metrics_base=args.metrics_base, netns=args.hosts or None)
        print(shards.servers, flush=True)
        if not command:
            while True:
                signal.pause()
        child = subprocess.Popen(
            [a.replace("{servers}", shards.servers) for a in command],
            env=dict(os.environ, ASYNCPS_SERVERS=shards.servers))
        return child.wait()
    except ShardFailed as e:
        print(f"asyncps.cluster: {e}", file=sys.stderr)
        return 1
    except _Stop:
        if child is not None and child.poll() is None:
            child.terminate()
            child.wait()
        return 0 if child is None else 143
    finally:
        # A second signal must not cut the shards' drain short.
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)
        shards.stop()  # Closes the logs too.


if __name__ == "__main__":
    sys.exit(main())
