#!/usr/bin/python3
"""A small convolutional network on Fashion-MNIST, in plain PyTorch, trained
through asyncps by wrapping its optimizer (asyncps.torch.DistributedOptimizer),
or, for comparison, by PyTorch's DistributedDataParallel.

Through the launcher (it starts the shards and the workers, and sets
ASYNCPS_SERVERS, ASYNCPS_RANK, ASYNCPS_NUM_WORKERS, which the defaults below
read):

    python3 -m asyncps.run --shards 2 --workers 2 --mode async -- \
        python/examples/fashion_cnn.py --epochs 2

Or one process per worker by hand:

    # two shards (python3 -m asyncps.cluster starts them on free ports):
    ps_server --shard=0 --num_shards=2 --port=5000 --mode=async &
    ps_server --shard=1 --num_shards=2 --port=5001 --mode=async &
    python3 python/examples/fashion_cnn.py --servers=localhost:5000,localhost:5001 \\
        --rank=0 --num_workers=2 --mode=async &
    python3 python/examples/fashion_cnn.py --servers=localhost:5000,localhost:5001 \\
        --rank=1 --num_workers=2 --mode=async

    # once both are done, the servers' weights on the 10,000 test images:
    python3 python/examples/fashion_cnn.py --servers=localhost:5000,localhost:5001 --evaluate

    # the same network under DDP (gloo), for samples/s on the same machine:
    python3 python/examples/fashion_cnn.py --ddp --rank=0 --num_workers=2 --port=29500 &
    python3 python/examples/fashion_cnn.py --ddp --rank=1 --num_workers=2 --port=29500

Each worker trains on its own share of the training set (example i goes to
rank i mod num_workers; in an elastic job, ps_server --elastic, its place
among the live workers of their number, taken again at each epoch's start:
docs/ELASTIC.md) and prints "done: rank R samples S samples/s S"; a SIGTERM
ends its training after the step (it leaves the job); --evaluate
prints "test_accuracy A" of the servers' weights (DDP's rank 0 prints its
own model's).
"""

import argparse
import gzip
import os
import signal
import struct
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip'd) as a numpy array."""
    with gzip.open(path, "rb") as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype != 0x08:
        raise ValueError(f"{path}: not an IDX file of bytes")
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    body = np.frombuffer(data, np.uint8, offset=4 + 4 * ndim)
    if body.size != int(np.prod(shape)):
        raise ValueError(f"{path}: {body.size} bytes for shape {shape}")
    return body.reshape(shape)


def load(split, data=DATA):
    """(images as float32 N x 1 x 28 x 28 in [0, 1], labels as int64)."""
    prefix = "train" if split == "train" else "t10k"
    x = read_idx(os.path.join(data, f"{prefix}-images-idx3-ubyte.gz"))
    y = read_idx(os.path.join(data, f"{prefix}-labels-idx1-ubyte.gz"))
    x = torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1)
    return x, torch.from_numpy(y.astype(np.int64))


class Net(nn.Module):
    """Two 5x5 convolutions with pooling, then two dense layers."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5, padding=2)
        self.conv2 = nn.Conv2d(16, 32, 5, padding=2)
        self.fc1 = nn.Linear(32 * 7 * 7, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def accuracy(model, x, y, batch=1000):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), batch):
            correct += (model(x[i:i + batch]).argmax(1) == y[i:i + batch]).sum().item()
    model.train()
    return correct / len(x)


def batches(x, y, share, batch, epochs, seed):
    """This worker's share through a DataLoader (DistributedSampler: example
    i of each epoch's seeded shuffle goes to the worker i mod size), where
    share["now"]() says (index, size) at each epoch's start."""
    dataset = torch.utils.data.TensorDataset(x, y)
    for epoch in range(epochs):
        index, size = share["now"]()
        if share.get("elastic"):
            print(f"epoch {epoch}: share {index} of {size}", flush=True)
        sampler = torch.utils.data.distributed.DistributedSampler(
            dataset, num_replicas=size, rank=index, shuffle=True,
            seed=seed, drop_last=True)
        sampler.set_epoch(epoch)
        yield from torch.utils.data.DataLoader(
            dataset, batch_size=batch, sampler=sampler, drop_last=True)


STOP = []  # Set by SIGTERM: train() ends after the step in progress.


class Batches:
    """The minibatches, and the share they are cut by (an elastic job's
    worker sets share["now"] once it has joined)."""

    def __init__(self, it, share):
        self.it, self.share = it, share

    def __iter__(self):
        return iter(self.it)


def train(model, opt, data, steps=None, log_every=0, clip=1.0,
          report=None, curve=None):
    """The ordinary PyTorch loop, with gradient clipping and a learning
    rate halved every 1000 steps; `opt` may be asyncps's or PyTorch's.
    `curve(step, seconds)`, if given, is called every step and its own time
    is not counted. Returns (samples, seconds)."""
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1000, gamma=0.5)
    samples, start, paused = 0, time.perf_counter(), 0.0
    for step, (xb, yb) in enumerate(data):
        if (steps is not None and step >= steps) or STOP:
            break
        opt.zero_grad()
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        opt.step()
        sched.step()
        samples += len(xb)
        if report is not None:
            report(loss=loss.item(), samples=len(xb))
        if log_every and step % log_every == 0:
            print(f"step {step} loss {loss.item():.4f}", flush=True)
        if curve is not None:
            t = time.perf_counter()
            curve(step + 1, t - start - paused)
            paused += time.perf_counter() - t
    return samples, time.perf_counter() - start - paused


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    env = os.environ
    p.add_argument("--servers", default=env.get(
        "ASYNCPS_SERVERS", "localhost:5000,localhost:5001"))
    p.add_argument("--rank", type=int, default=int(env.get(
        "ASYNCPS_RANK", env.get("RANK", 0))))
    p.add_argument("--num_workers", type=int, default=int(env.get(
        "ASYNCPS_NUM_WORKERS", env.get("WORLD_SIZE", 1))))
    p.add_argument("--mode", default=env.get("ASYNCPS_MODE", "async"),
                   choices=["async", "ssp", "bsp"])
    p.add_argument("--clip", type=float, default=1.0,
                   help="clip_grad_norm_ bound (0: none)")
    p.add_argument("--overlap", action="store_true",
                   help="asyncps: push each gradient during backward and "
                   "prefetch its weights (needs --clip=0: a clipped "
                   "gradient changes after it left)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many steps (default: the epochs)")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1,
                   help="PyTorch's intra-op threads per worker")
    p.add_argument("--data", default=DATA)
    p.add_argument("--outer", default=None, choices=["diloco", "easgd"],
                   help="local steps with the SGD here, then an outer "
                        "optimizer on the servers (docs/MODES.md)")
    p.add_argument("--local_steps", type=int, default=8,
                   help="--outer: steps between exchanges")
    p.add_argument("--ddp", action="store_true",
                   help="train with DistributedDataParallel (gloo) instead")
    p.add_argument("--port", type=int, default=29500, help="--ddp: rendezvous port")
    p.add_argument("--log_every", type=int, default=200)
    p.add_argument("--curve", default="",
                   help="rank 0: write seconds,step,test_accuracy to this "
                   "CSV every --curve_every steps (on the first 2,000 test "
                   "images; the time scoring takes is not counted)")
    p.add_argument("--curve_every", type=int, default=100)
    p.add_argument("--evaluate", action="store_true",
                   help="score the servers' weights on the test set")
    p.add_argument("--test_examples", type=int, default=0,
                   help="--evaluate: score the first N test images (0: all)")
    p.add_argument("--declare_only", action="store_true",
                   help="--evaluate: declare the model first (as a worker "
                   "would), to score the initial weights")
    return p.parse_args()


def evaluate(args, model, tx, ty):
    """--evaluate: the servers' weights (after declaring the model, with
    --declare_only) scored on the test set."""
    import asyncps
    if args.declare_only:
        import asyncps.torch
        worker = asyncps.Client(args.servers, rank=args.rank,
                                num_workers=args.num_workers,
                                mode=args.mode)
        asyncps.torch.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=args.lr,
                            momentum=args.momentum),
            worker, named_parameters=model.named_parameters()).close()
    import asyncps.torch
    asyncps.torch.load_state_dict(model, args.servers)
    if args.test_examples > 0:
        tx, ty = tx[:args.test_examples], ty[:args.test_examples]
    print(f"test_accuracy {accuracy(model, tx, ty):.4f}", flush=True)


def curve_writer(args, model, tx, ty):
    """--curve on rank 0: train()'s `curve`, writing the CSV; else None."""
    if not (args.curve and args.rank == 0):
        return None
    out = open(args.curve, "w")
    out.write("seconds,step,test_accuracy\n")

    def curve(step, seconds):
        if step % args.curve_every == 0:
            acc = accuracy(model, tx[:2000], ty[:2000])
            out.write(f"{seconds:.3f},{step},{acc:.4f}\n")
            out.flush()
    return curve


def train_ddp(args, model, data, curve, tx, ty):
    """--ddp: trains under DistributedDataParallel (gloo); returns
    (samples, seconds)."""
    import torch.distributed as dist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(args.port))
    dist.init_process_group("gloo", rank=args.rank,
                            world_size=args.num_workers)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr,
                          momentum=args.momentum)
    samples, seconds = train(ddp, opt, data, args.steps, args.log_every,
                             args.clip, curve=curve)
    if args.rank == 0:
        print(f"test_accuracy {accuracy(model, tx, ty):.4f}", flush=True)
    dist.destroy_process_group()
    return samples, seconds


def train_asyncps(args, model, data, curve, tx, ty):
    """Trains through the asyncps servers, the optimizer wrapped; returns
    (samples, seconds)."""
    import asyncps
    import asyncps.torch
    client = asyncps.Client(args.servers, rank=args.rank,
                            num_workers=args.num_workers, mode=args.mode)
    args.rank = client.rank  # The servers' choice, with rank -1.
    if client.members()["elastic"]:
        def now():
            m = client.members()
            return m["index"], m["size"]
        data.share["now"] = now
        data.share["elastic"] = True
    opt = asyncps.torch.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=args.lr,
                        momentum=args.momentum),
        client, named_parameters=model.named_parameters(),
        overlap=args.overlap,
        **({"outer": args.outer, "local_steps": args.local_steps}
           if args.outer else {}))
    samples, seconds = train(model, opt, data, args.steps, args.log_every,
                             args.clip, report=opt.report, curve=curve)
    print(f"exchange_fraction {opt.exchange_seconds / seconds:.4f}",
          flush=True)
    print(f"wrapper_fraction {opt.wrapper_seconds / seconds:.4f}",
          flush=True)
    if args.rank == 0:
        print(f"test_accuracy {accuracy(model, tx, ty):.4f}", flush=True)
    opt.close()  # Leaves: the others stop waiting for this worker.
    return samples, seconds


def main():
    args = parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)  # Every worker builds the same network.
    tx, ty = load("test", args.data)
    model = Net()
    if args.evaluate:
        evaluate(args, model, tx, ty)
        return 0
    x, y = load("train", args.data)
    signal.signal(signal.SIGTERM, lambda *_: STOP.append(True))
    share = {"now": lambda: (max(args.rank, 0), args.num_workers)}
    data = Batches(batches(x, y, share, args.batch, args.epochs, args.seed),
                   share)
    curve = curve_writer(args, model, tx, ty)
    train_with = train_ddp if args.ddp else train_asyncps
    samples, seconds = train_with(args, model, data, curve, tx, ty)
    print(f"done: rank {args.rank} samples {samples} samples/s "
          f"{samples / seconds:.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
