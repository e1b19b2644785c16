#!/usr/bin/python3
"""PyTorch on the same job as asyncps: MLP 784-256-128-10 on Fashion-MNIST,
batch 64 per process, SGD with momentum 0.9 and lr 0.02, one CPU thread per
process (as ps_worker --blas_threads=1).

  tools/bench/compare_pytorch.py --mode=single          # one process
  tools/bench/compare_pytorch.py --mode=ddp --procs=2   # DDP over gloo

Prints one line: "pytorch mode=M procs=P samples_per_s=S seconds=T
last_loss=L" (samples of every process together). Needs Debian's
python3-torch (run with /usr/bin/python3).
"""
import argparse
import gzip
import os
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

DATA = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        data = f.read()
    magic, = struct.unpack(">I", data[:4])
    dims = magic & 0xFF
    shape = struct.unpack(">" + "I" * dims, data[4:4 + 4 * dims])
    body = data[4 + 4 * dims:]
    return torch.frombuffer(bytearray(body), dtype=torch.uint8).reshape(shape)


def find(name):
    for suffix in ("", ".gz"):
        p = os.path.join(DATA, name + suffix)
        if os.path.exists(p):
            return p
    sys.exit(f"compare_pytorch: no {name} in {DATA}")


def load(rank, procs):
    x = read_idx(find("train-images-idx3-ubyte")).reshape(-1, 784).float() / 255
    y = read_idx(find("train-labels-idx1-ubyte")).long()
    return x[rank::procs].contiguous(), y[rank::procs].contiguous()


def model():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128),
                         nn.ReLU(), nn.Linear(128, 10))


def train(rank, procs, args, port, out):
    torch.set_num_threads(1)
    net = model()
    if procs > 1:
        os.environ["MASTER_ADDR"] = "127.0.0.1"
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=rank, world_size=procs)
        net = nn.parallel.DistributedDataParallel(net)
    x, y = load(rank, procs)
    opt = torch.optim.SGD(net.parameters(), lr=args.lr, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(rank)
    steps = 0
    start = time.perf_counter()
    for _ in range(args.epochs):
        order = torch.randperm(len(x), generator=gen)
        for b in range(0, len(x) - args.batch_size + 1, args.batch_size):
            idx = order[b:b + args.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(net(x[idx]), y[idx])
            loss.backward()
            opt.step()
            steps += 1
    seconds = time.perf_counter() - start
    if procs > 1:
        dist.destroy_process_group()
    out.put((rank, steps * args.batch_size, seconds, float(loss)))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mode", choices=["single", "ddp"], default="single")
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch_size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    procs = 1 if args.mode == "single" else args.procs
    port = args.port
    if port == 0:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    workers = [ctx.Process(target=train, args=(r, procs, args, port, out))
               for r in range(procs)]
    for w in workers:
        w.start()
    results = [out.get() for _ in workers]
    for w in workers:
        w.join()
    samples = sum(r[1] for r in results)
    seconds = max(r[2] for r in results)
    print(f"pytorch mode={args.mode} procs={procs} "
          f"samples_per_s={samples / seconds:.0f} seconds={seconds:.1f} "
          f"last_loss={results[0][3]:.4f}")


if __name__ == "__main__":
    main()
