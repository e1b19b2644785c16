#!/usr/bin/python3
"""Click-through-rate training four ways on the same data and model: why a
parameter server beats all-reduce for large embedding tables
(docs/SPARSE.md).

  tools/experiments/ctr_experiment.py --rows 10000000 --samples 100000 \
      --out /tmp/ctr

The data: asyncps.ctr.CtrData (8 Zipf-distributed categorical fields over
--rows table rows, labels from a known factorization machine, so the best
achievable AUC is known). The model: one embedding table of --rows x --dim,
the 8 fields' rows and their 28 pairwise dot products into an MLP
(256-128-1), binary cross-entropy; AdaGrad for the table (lr 0.05) and the
MLP (lr 0.01). --workers processes (default 2), each one CPU thread, batch
--batch each, all stopping after --samples examples in total:

  async       asyncps, the table as asyncps.torch.Embedding (only the rows a
              batch touches travel; forward pulls them, or with --prefetch 1
              each push brings the next batch's rows back), the MLP through
              DistributedOptimizer, 2 shards, mode async
  bsp         the same, mode bsp (the MLP in lock step; rows are applied as
              they arrive in every mode, docs/SPARSE.md)
  ddp_dense   PyTorch DDP (gloo), torch.nn.Embedding with dense gradients:
              the whole table's gradient is all-reduced every step
  ddp_sparse  PyTorch DDP, torch.nn.Embedding(sparse=True): sparse
              gradients (gloo all-gathers them)

Worker 0 scores the model on --test held-out examples every --eval_every
samples of its own (not counted in the training time). Prints one JSON line
per configuration (samples_per_s, bytes_per_step on the loopback, the
largest resident memory of a worker and of a shard in MB, the final AUC and
the generator's best) and writes OUT/ctr.json, OUT/auc-<config>.dat and
OUT/auc.png (AUC against training time, gnuplot). Needs Debian's
python3-torch (run with /usr/bin/python3) and the asyncps module
(PYTHONPATH=bazel-bin/python after bazel build //python:asyncps
//server:ps_server).
"""

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

CONFIGS = ("async", "bsp", "ddp_dense", "ddp_sparse")


class Top(nn.Module):
    """The dense part: fields' rows and their pairwise dot products into an
    MLP, one logit out."""

    def __init__(self, fields, dim):
        super().__init__()
        torch.manual_seed(1)
        self.pairs = torch.triu_indices(fields, fields, offset=1)
        width = fields * dim + self.pairs.shape[1]
        self.mlp = nn.Sequential(nn.Linear(width, 256), nn.ReLU(),
                                 nn.Linear(256, 128), nn.ReLU(),
                                 nn.Linear(128, 1))

    def forward(self, e):  # e: [batch, fields, dim]
        dots = torch.bmm(e, e.transpose(1, 2))[:, self.pairs[0],
                                                self.pairs[1]]
        return self.mlp(torch.cat([e.flatten(1), dots], 1)).squeeze(1)


class Ctr(nn.Module):
    def __init__(self, table, fields, dim):
        super().__init__()
        self.table = table
        self.top = Top(fields, dim)

    def forward(self, ids):
        return self.top(self.table(ids))


def loopback_bytes():
    """Bytes sent on the loopback so far (every process on it)."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    return 0


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def evaluate(model, test_ids, test_labels, auc):
    with torch.no_grad():
        scores = torch.cat([model(torch.from_numpy(test_ids[i:i + 4096]))
                            for i in range(0, len(test_ids), 4096)])
    return auc(scores.numpy(), test_labels)


def make_model(rank, args, config, port, servers, fields):
    """Worker `rank`'s (model, table, asyncps client, asyncps optimizer,
    every optimizer): for async and bsp the table is an
    asyncps.torch.Embedding and the MLP trains through DistributedOptimizer;
    for the DDP configurations (client and optimizer None) both are local,
    under DDP over gloo on `port`."""
    dim = args.dim
    if config in ("async", "bsp"):
        import asyncps
        import asyncps.torch
        client = asyncps.Client(servers, rank=rank,
                                num_workers=args.workers, mode=config)
        table = asyncps.torch.Embedding(args.rows, dim, client=client,
                                        name="ctr", optimizer="adagrad",
                                        lr=0.05, init_stddev=0.01,
                                        seed=args.seed,
                                        admit_count=args.row_admit_count,
                                        ttl=args.ttl)
        model = Ctr(table, fields, dim)
        opt = asyncps.torch.DistributedOptimizer(
            torch.optim.Adagrad(model.top.parameters(), lr=0.01), client,
            named_parameters=model.top.named_parameters())
        return model, table, client, opt, [opt]
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=args.workers)
    table = nn.Embedding(args.rows, dim, sparse=config == "ddp_sparse")
    with torch.no_grad():
        table.weight.normal_(0.0, 0.01,
                             generator=torch.Generator().manual_seed(0))
    model = nn.parallel.DistributedDataParallel(Ctr(table, fields, dim))
    opts = [torch.optim.Adagrad(model.module.table.parameters(), lr=0.05),
            torch.optim.Adagrad(model.module.top.parameters(), lr=0.01)]
    return model, table, None, None, opts


def worker(rank, args, config, port, servers, out):
    """One training process; puts its result on `out`."""
    torch.set_num_threads(1)
    from asyncps.ctr import CtrData, auc
    data = CtrData(args.rows, seed=args.seed)
    model, table, client, opt, opts = make_model(rank, args, config, port,
                                                  servers, data.fields)
    loss_fn = nn.BCEWithLogitsLoss()
    test_ids, test_labels, _ = (data.test_set(args.test) if rank == 0 else
                                (None, None, None))
    steps = args.samples // (args.batch * args.workers)
    eval_steps = max(1, args.eval_every // args.batch)
    curve, train_s, eval_bytes = [], 0.0, 0
    if rank == 0:
        curve.append((0.0, 0, evaluate(model, test_ids, test_labels, auc)))
    if client is None:
        dist.barrier()
    start_bytes = loopback_bytes()
    t = time.perf_counter()
    def batch(step):
        # Worker r takes batches r, r + W, r + 2W, ... of the stream.
        return data.batch(step * args.workers + rank, args.batch)

    upcoming = batch(0)
    for step in range(steps):
        ids, labels = upcoming
        if step + 1 < steps:
            upcoming = batch(step + 1)
        for o in opts:
            o.zero_grad()
        loss = loss_fn(model(torch.from_numpy(ids)), torch.from_numpy(labels))
        if client is not None and args.prefetch and step + 1 < steps:
            # The next batch's rows come back with this batch's push.
            table.prefetch(upcoming[0])
        loss.backward()
        for o in opts:
            o.step()
        if rank == 0 and ((step + 1) % eval_steps == 0 or step + 1 == steps):
            train_s += time.perf_counter() - t
            b0 = loopback_bytes()
            if client is not None:
                opt.pull()
            a = evaluate(model, test_ids, test_labels, auc)
            curve.append((train_s, (step + 1) * args.batch * args.workers, a))
            eval_bytes += loopback_bytes() - b0
            t = time.perf_counter()
    train_s += time.perf_counter() - t
    if client is None:
        dist.barrier()
    sent = loopback_bytes() - start_bytes - eval_bytes
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if client is not None:
        opt.close()  # Leaves the job.
    else:
        dist.destroy_process_group()
    out.put({"rank": rank, "steps": steps, "seconds": train_s,
             "bytes": sent, "rss_mb": rss_mb, "curve": curve,
             "loss": float(loss)})


def shard_rss_mb(shards):
    """The largest resident memory (VmHWM) among the shards, in MB."""
    peak = 0
    for s in shards.shards:
        with open(f"/proc/{s.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]) / 1024)
    return peak


def run(args, config):
    servers, shards = None, None
    if config in ("async", "bsp"):
        from asyncps.cluster import Shards
        shards = Shards(args.ps_server, mode=config)
        servers = ",".join(shards.start(args.shards))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=worker,
                         args=(r, args, config, port, servers, out))
             for r in range(args.workers)]
    try:
        for p in procs:
            p.start()
        results = []
        while len(results) < len(procs):
            try:
                results.append(out.get(timeout=5))
            except Exception:  # queue.Empty: is a worker gone?
                if any(p.exitcode not in (None, 0) for p in procs):
                    raise SystemExit(f"ctr_experiment: a {config} worker "
                                     f"failed")
        for p in procs:
            p.join()
        shard_mb = shard_rss_mb(shards) if shards else 0
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        if shards:
            shards.stop()
    results.sort(key=lambda r: r["rank"])
    steps = sum(r["steps"] for r in results)
    seconds = max(r["seconds"] for r in results)
    curve = results[0]["curve"]
    return {
        "config": config, "rows": args.rows, "dim": args.dim,
        "workers": args.workers, "batch": args.batch,
        "samples": steps * args.batch,
        "samples_per_s": round(steps * args.batch / seconds, 1),
        "seconds": round(seconds, 2),
        # Loopback bytes of the whole job (both directions counted once:
        # each byte is sent once) per worker step.
        "bytes_per_step": int(results[0]["bytes"] / max(steps, 1)),
        "worker_rss_mb": round(max(r["rss_mb"] for r in results)),
        "shard_rss_mb": round(shard_mb),
        "auc": round(curve[-1][2], 4),
        "curve": curve,
    }


def plot(out, results, best):
    parts = []
    for r in results:
        dat = os.path.join(out, f"auc-{r['config']}.dat")
        with open(dat, "w") as f:
            for s, n, a in r["curve"]:
                f.write(f"{s:.3f} {n} {a:.5f}\n")
        parts.append(f"'{dat}' using 1:3 with linespoints title "
                     f"'{r['config']}'")
    parts.append(f"{best} with lines dashtype 2 title 'best possible'")
    script = f"""set terminal pngcairo size 800,500 noenhanced
set output '{os.path.join(out, "auc.png")}'
set key bottom right
set title 'CTR, {results[0]["rows"]} rows x {results[0]["dim"]}, {results[0]["workers"]} workers: test AUC'
set xlabel 'training time (s)'
set ylabel 'test AUC'
set logscale x
set grid
plot {", ".join(parts)}
"""
    # A log scale needs x > 0: the first point (before training) is at 0.
    script = script.replace("using 1:3", "using ($1 > 0 ? $1 : 0.1):3")
    subprocess.run(["gnuplot"], input=script, text=True, check=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=1_000_000)
    p.add_argument("--dim", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--samples", type=int, default=100_000,
                   help="examples trained on, all workers together")
    p.add_argument("--eval_every", type=int, default=20_000,
                   help="worker 0 scores the model every this many of its "
                        "own examples")
    p.add_argument("--test", type=int, default=20_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--configs", default=",".join(CONFIGS))
    p.add_argument("--prefetch", type=int, default=0,
                   help="asyncps: 1, each push brings the next batch's rows "
                        "back (Embedding.prefetch); 0, forward pulls them "
                        "(on loopback 0 is faster: docs/SPARSE.md)")
    p.add_argument("--row_admit_count", type=int, default=1,
                   help="asyncps: an id gets a row at its N-th push "
                        "(docs/SPARSE.md \"Admission\")")
    p.add_argument("--row_ttl", default="",
                   help="asyncps: a row not pushed for this many of its "
                        "table's pushes (an integer) or this long (10m) is "
                        "removed; empty: never")
    p.add_argument("--ps_server", default=os.environ.get(
        "ASYNCPS_PS_SERVER", "bazel-bin/server/ps_server"))
    p.add_argument("--out", default="")
    args = p.parse_args()
    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            p.error(f"--configs: unknown configuration {c!r} (want "
                    f"{', '.join(CONFIGS)})")
    if args.samples < args.batch * args.workers:
        p.error("--samples: fewer than one step of every worker")
    if args.row_admit_count < 1:
        p.error(f"--row_admit_count {args.row_admit_count}: below 1 (1: a "
                f"row at an id's first push)")
    args.ttl = None
    if args.row_ttl:
        args.ttl = (int(args.row_ttl) if args.row_ttl.isdigit()
                    else args.row_ttl)
        if args.ttl == 0:
            p.error("--row_ttl 0: empty for never, else >= 1")
    from asyncps.ctr import CtrData
    best = CtrData(args.rows, seed=args.seed).best_auc(args.test)
    results = []
    for c in configs:
        r = run(args, c)
        r["best_auc"] = round(best, 4)
        results.append(r)
        print(json.dumps({k: v for k, v in r.items() if k != "curve"}),
              flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "ctr.json"), "w") as f:
            json.dump(results, f, indent=1)
        plot(args.out, results, best)


if __name__ == "__main__":
    sys.exit(main())
