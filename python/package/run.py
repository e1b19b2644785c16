"""asyncps's launcher: shards and workers for one training script.

    python3 -m asyncps.run --shards 2 --workers 2 --mode async -- train.py ARGS
    python3 -m asyncps.run --servers h0:5000,h1:5000 --workers 2 -- train.py

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
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile

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
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--mode", default="async",
                   choices=["async", "ssp", "bsp"])
    p.add_argument("--servers", default="",
                   help="join these shards (host:port,...) instead")
    p.add_argument("--max_restarts", type=int, default=3,
                   help="failed workers started again, in all")
    p.add_argument("--ps_server", default="", help="the ps_server binary")
    p.add_argument("--server_flag", action="append", default=[],
                   help="one more flag for every shard (repeatable)")
    p.add_argument("--log_dir", default="",
                   help="write each shard's log here")
    args = p.parse_args(ours)
    if not script:
        p.error("no script: put it after --, e.g. -- train.py --epochs 2")
    if args.workers < 1 or args.shards < 1 or args.max_restarts < 0:
        p.error("--workers and --shards must be >= 1, --max_restarts >= 0")
    if not os.path.exists(script[0]):
        p.error(f"no script '{script[0]}'")
    return args, script


def start_shards(args, ready_dir, shards):
    """Starts --shards shards, each appended to `shards` before it starts
    (so that the caller stops those that did), and returns their servers
    line; SystemExit if one does not start."""
    binary = find_server(args.ps_server)
    if args.log_dir:
        os.makedirs(args.log_dir, exist_ok=True)
    for i in range(args.shards):
        log = (open(os.path.join(args.log_dir, f"shard{i}.log"), "a")
               if args.log_dir else None)
        shards.append(Shard(binary, i, args.shards,
                            [f"--mode={args.mode}", *args.server_flag],
                            log, ready_dir))
        try:
            shards[-1].start()
        except ShardFailed as e:
            raise SystemExit(f"asyncps.run: {e}")
    return ",".join(s.address for s in shards)


def worker_env(args, servers, rank):
    """The environment of worker `rank`: asyncps's variables and
    torchrun's."""
    return dict(os.environ,
                ASYNCPS_SERVERS=servers, ASYNCPS_RANK=str(rank),
                ASYNCPS_NUM_WORKERS=str(args.workers),
                ASYNCPS_MODE=args.mode, RANK=str(rank),
                WORLD_SIZE=str(args.workers), LOCAL_RANK=str(rank),
                LOCAL_WORLD_SIZE=str(args.workers))


def supervise(args, workers, shards, launch):
    """Waits for every worker (rank -> Popen) to finish: a shard that exits
    is started again, a worker that fails is launched again with its rank
    while --max_restarts allows. Returns 0, or the exit status of the
    worker that failed past the restarts (SystemExit if a shard does not
    start again)."""
    restarts = 0
    running = set(workers)
    while running:
        pid, status = os.wait()
        code = os.waitstatus_to_exitcode(status)
        rank = next((r for r, w in workers.items() if w.pid == pid), None)
        if rank is None:
            shard = next((s for s in shards if s.proc.pid == pid), None)
            if shard is not None:
                shard.proc.returncode = code
                print(f"asyncps.run: shard {shard.index} exited "
                      f"({code}); starting it again", file=sys.stderr)
                try:
                    shard.start()
                except ShardFailed as e:
                    raise SystemExit(f"asyncps.run: {e}")
            continue
        workers[rank].returncode = code
        if code == 0:
            running.discard(rank)
            continue
        if restarts >= args.max_restarts:
            print(f"asyncps.run: worker {rank} failed ({code}) and "
                  f"--max_restarts={args.max_restarts} are used up",
                  file=sys.stderr)
            return code if code > 0 else 128 - code
        restarts += 1
        print(f"asyncps.run: worker {rank} failed ({code}); starting it "
              f"again ({restarts}/{args.max_restarts})", file=sys.stderr)
        launch(rank)
    return 0


def stop_all(workers, shards, ready_dir):
    """Kills the workers still running, stops the shards and removes the
    shards' files."""
    for w in workers.values():
        if w.poll() is None:
            w.kill()
    for w in workers.values():
        w.wait()
    for s in shards:
        s.stop()
    shutil.rmtree(ready_dir, ignore_errors=True)


def main(argv=None):
    args, script = parse(sys.argv[1:] if argv is None else argv)
    shards = []
    workers = {}  # rank -> Popen
    ready_dir = tempfile.mkdtemp(prefix="asyncps-run-")  # The shards' files.
    signal.signal(signal.SIGTERM, lambda n, f: sys.exit(128 + n))
    try:
        servers = args.servers or start_shards(args, ready_dir, shards)

        def launch(rank):
            workers[rank] = subprocess.Popen(
                [sys.executable, *script],
                env=worker_env(args, servers, rank))

        for rank in range(args.workers):
            launch(rank)
        return supervise(args, workers, shards, launch)
    finally:
        stop_all(workers, shards, ready_dir)


if __name__ == "__main__":
    sys.exit(main())
