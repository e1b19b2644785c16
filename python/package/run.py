"""asyncps's launcher: shards and workers for one training script.

    python3 -m asyncps.run --shards 2 --workers 2 --mode async -- train.py ARGS
    python3 -m asyncps.run --servers h0:5000,h1:5000 --workers 2 -- train.py
    python3 -m asyncps.run -H h1:2,h2:2 --shards 2 -- train.py ARGS
    python3 -m asyncps.run --shards 2 --workers 2 -- ps_worker --epochs=1

Starts the shards (ps_server on 127.0.0.1, ports the kernel picks), or joins
existing ones with --servers, then runs the script once per worker with
ASYNCPS_SERVERS, ASYNCPS_RANK, ASYNCPS_NUM_WORKERS and ASYNCPS_MODE set (and
torchrun's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), so
`asyncps.Client()` needs no argument. A worker that fails is started again
with the same rank, up to --max_restarts times in all; a shard that dies is
started again on its port (it gets the model back from a worker's copy).
Once every worker has finished, the shards are stopped and the launcher
exits 0; when a worker fails past the restarts, everything is stopped and
the launcher exits with that worker's status. Nothing is left running.
With --elastic the shards take workers that join and leave while the job
trains (docs/ELASTIC.md): `--elastic --servers ... --workers N` adds N
workers to a running job (ASYNCPS_RANK=-1: the servers give each a rank),
and a Ctrl-C or SIGTERM of that launcher takes them out again.
A script not ending in .py (or any, with --no_python) runs as a command:
ps_worker takes --servers, --rank, --num_workers and --mode from the same
variables when they are not given; --mode allreduce is for it alone.

With -H (or --hostfile) the shards and workers run on those hosts over ssh
(as horovodrun does; asyncps.hosts): workers fill each host's slots in
order, shard i runs on host i % hosts, each with the launcher's directory
and environment (less what describes this login: HOME, USER, SSH_*), and
their output comes here line by line as "[host:rank] ..." (a shard's as
"[host:shardI] ...", or into --log_dir). The same paths (Python, ps_server,
the script) must hold on every host. A Ctrl-C, or a worker or shard that
fails past --max_restarts, stops everything on every host.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

from asyncps import hosts as hostlib
from asyncps.cluster import Shard, ShardFailed


def find_server(given):
    """ps_server: --ps_server, $ASYNCPS_PS_SERVER, next to this package
    (pip's install), or on PATH."""
    for candidate in (given, os.environ.get("ASYNCPS_PS_SERVER"),
                      os.path.join(os.path.dirname(__file__), "bin",
                                   "ps_server"),
                      shutil.which("ps_server")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise SystemExit("asyncps.run: no ps_server (pass --ps_server PATH or "
                     "set ASYNCPS_PS_SERVER)")


def parse(argv):
    if "--" in argv:
        cut = argv.index("--")
        ours, script = argv[:cut], argv[cut + 1:]
    else:
        ours, script = argv, []
    p = argparse.ArgumentParser(
        prog="python3 -m asyncps.run",
        description=__doc__.split("\n\n")[0],
        epilog="Everything after -- is the script and its arguments.")
    p.add_argument("--shards", type=int, default=1,
                   help="shards to start (not with --servers)")
    p.add_argument("--workers", type=int, default=None,
                   help="workers (default: the hosts' slots, or 1)")
    p.add_argument("--mode", default="async",
                   choices=["async", "ssp", "bsp", "allreduce"],
                   help="allreduce: ps_worker's ring (not a Python script's)")
    p.add_argument("--servers", default="",
                   help="join these shards (host:port,...) instead")
    p.add_argument("--max_restarts", type=int, default=3,
                   help="failed workers and shards started again, in all")
    p.add_argument("-H", "--hosts", default="",
                   help="run on these hosts over ssh: host:slots,...")
    p.add_argument("--hostfile", default="",
                   help="the hosts, a line each: 'host slots=N' or host:N")
    p.add_argument("-p", "--ssh_port", type=int, default=0)
    p.add_argument("-i", "--ssh_identity_file", default="")
    p.add_argument("--ssh_option", action="append", default=[],
                   help="one more ssh -o option, e.g. "
                        "StrictHostKeyChecking=no (repeatable)")
    p.add_argument("--ps_server", default="", help="the ps_server binary")
    p.add_argument("--no_python", action="store_true",
                   help="run the script as a command (the default for one "
                        "not ending in .py, e.g. ps_worker)")
    p.add_argument("--elastic", action="store_true",
                   help="an elastic job (docs/ELASTIC.md): the shards take "
                        "workers joining and leaving while it trains; with "
                        "--servers, these workers join a running one (the "
                        "servers give each a rank)")
    p.add_argument("--server_flag", action="append", default=[],
                   help="one more flag for every shard (repeatable)")
    p.add_argument("--log_dir", default="",
                   help="write each shard's log here")
    args = p.parse_args(ours)
    args.host_list = None
    if args.hosts and args.hostfile:
        p.error("give -H or --hostfile, not both")
    try:
        if args.hosts:
            args.host_list = hostlib.parse_hosts(args.hosts)
        elif args.hostfile:
            args.host_list = hostlib.read_hostfile(args.hostfile)
    except (ValueError, OSError) as e:
        p.error(str(e))
    if args.workers is None:
        args.workers = (sum(n for _, n in args.host_list)
                        if args.host_list else 1)
    if not script:
        p.error("no script: put it after --, e.g. -- train.py --epochs 2")
    if args.workers < 1 or args.shards < 1 or args.max_restarts < 0:
        p.error("--workers and --shards must be >= 1, --max_restarts >= 0")
    if is_python(args, script):
        if not os.path.exists(script[0]):
            p.error(f"no script '{script[0]}'")
        if args.mode == "allreduce":
            p.error("--mode allreduce trains through ps_worker's ring; "
                    "asyncps.Client has no all-reduce: run ps_worker "
                    "(-- ps_worker ...), or a PS mode")
    elif not (os.path.exists(script[0]) or shutil.which(script[0])):
        p.error(f"no command '{script[0]}'")
    return args, script


def is_python(args, script):
    return script[0].endswith(".py") and not args.no_python


def job_command(args, script):
    """What each worker runs: the script with this Python, or the command
    as it is (ps_worker reads the same variables as asyncps.Client)."""
    return [sys.executable, *script] if is_python(args, script) else script


def start_shards(args, ready_dir, shards, placed=None, env=None):
    """Starts --shards shards (on the hosts `placed` names, if any), each
    appended to `shards` before it starts (so that the caller stops those
    that did), and returns their servers line; SystemExit if one does not
    start."""
    binary = find_server(args.ps_server)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    flags = [f"--mode={args.mode}", *(["--elastic"] if args.elastic else []),
             *args.server_flag]
    for i in range(args.shards):
        log = (open(os.path.join(args.log_dir, f"shard{i}.log"), "a")
               if args.log_dir else None)
        if placed is None:
            shards.append(Shard(binary, i, args.shards, flags, log,
                                ready_dir))
        else:
            shards.append(hostlib.RemoteShard(binary, i, args.shards, flags,
                                              placed[i], ssh_options(args),
                                              env, log))
        try:
            shards[-1].start()
        except ShardFailed as e:
            raise SystemExit(f"asyncps.run: {e}")
    return ",".join(s.address for s in shards)


def ssh_options(args):
    """ssh's options from -p, -i and --ssh_option."""
    options = ["-p", str(args.ssh_port)] if args.ssh_port else []
    if args.ssh_identity_file:
        options += ["-i", args.ssh_identity_file]
    for o in args.ssh_option:
        options += ["-o", o]
    return options


def worker_env(args, servers, rank, base=None, local=None):
    """The environment of worker `rank`: `base` (this process's) with
    asyncps's variables and torchrun's; `local` is (LOCAL_RANK,
    LOCAL_WORLD_SIZE), by default rank and --workers (one host)."""
    local_rank, local_size = local or (rank, args.workers)
    # Workers joining a running elastic job are given ranks by the servers.
    joining = args.elastic and args.servers
    return dict(os.environ if base is None else base,
                ASYNCPS_SERVERS=servers,
                ASYNCPS_RANK="-1" if joining else str(rank),
                ASYNCPS_NUM_WORKERS=str(args.workers),
                ASYNCPS_MODE=args.mode, RANK=str(rank),
                WORLD_SIZE=str(args.workers), LOCAL_RANK=str(local_rank),
                LOCAL_WORLD_SIZE=str(local_size))


def supervise(args, workers, shards, launch):
    """Waits for every worker (rank -> Popen or hosts.Remote) to finish: a
    shard that exits is started again, a worker that fails is launched
    again with its rank, while --max_restarts (for both, in all) allows.
    Returns 0, or the exit status of the worker or shard that failed past
    the restarts (SystemExit if a shard does not start again)."""
    restarts = 0
    running = set(workers)
    while running:
        pid, status = os.wait()
        code = os.waitstatus_to_exitcode(status)
        rank = next((r for r, w in workers.items() if w.pid == pid), None)
        shard = next((s for s in shards if s.proc.pid == pid), None)
        if rank is None and shard is None:
            continue
        what = f"worker {rank}" if shard is None else f"shard {shard.index}"
        if shard is not None:
            shard.proc.returncode = code
        else:
            getattr(workers[rank], "proc", workers[rank]).returncode = code
            if code == 0:
                running.discard(rank)
                continue
        if restarts >= args.max_restarts:
            print(f"asyncps.run: {what} failed ({code}) and "
                  f"--max_restarts={args.max_restarts} are used up",
                  file=sys.stderr)
            return code if code > 0 else 128 - code
        restarts += 1
        print(f"asyncps.run: {what} failed ({code}); starting it "
              f"again ({restarts}/{args.max_restarts})", file=sys.stderr)
        if shard is None:
            launch(rank)
            continue
        try:
            shard.start()
        except ShardFailed as e:
            raise SystemExit(f"asyncps.run: {e}")
    return 0


def stop_all(workers, shards, ready_dir):
    """Stops the workers still running (SIGTERM: each leaves the job after
    its step; SIGKILL after 10 s. On other hosts: SIGTERM), then the
    shards, and removes the shards' files."""
    for w in workers.values():
        if w.poll() is None:
            w.terminate() if isinstance(w, subprocess.Popen) else w.kill()
    for w in workers.values():
        try:
            w.wait(timeout=10) if isinstance(w, subprocess.Popen) else w.wait()
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()
    for s in shards:
        s.stop()
    shutil.rmtree(ready_dir, ignore_errors=True)


def main(argv=None):
    args, script = parse(sys.argv[1:] if argv is None else argv)
    shards = []
    workers = {}  # rank -> Popen, or hosts.Remote with -H
    ready_dir = tempfile.mkdtemp(prefix="asyncps-run-")  # The shards' files.
    signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n))
    try:
        if args.host_list is None:
            servers = args.servers or start_shards(args, ready_dir, shards)

            def launch(rank):
                workers[rank] = subprocess.Popen(
                    job_command(args, script),
                    env=worker_env(args, servers, rank))
        else:
            try:
                by_rank, placed = hostlib.place(args.host_list, args.workers,
                                                args.shards)
            except ValueError as e:
                raise SystemExit(f"asyncps.run: {e}")
            env = hostlib.passed_env(os.environ)
            servers = args.servers or start_shards(args, ready_dir, shards,
                                                   placed, env)

            def launch(rank):
                host, local_rank, local_size = by_rank[rank]
                workers[rank] = hostlib.Remote(
                    host, ssh_options(args), job_command(args, script),
                    worker_env(args, servers, rank, env,
                               (local_rank, local_size)),
                    f"[{host}:{rank}] ")

        for rank in range(args.workers):
            launch(rank)
        return supervise(args, workers, shards, launch)
    except KeyboardInterrupt:
        print("asyncps.run: interrupted; stopping everything",
              file=sys.stderr)
        return 130
    finally:
        stop_all(workers, shards, ready_dir)


if __name__ == "__main__":
    sys.exit(main())
