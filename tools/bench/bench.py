#!/usr/bin/python3
"""Every speed figure of asyncps against its ceiling, measured in one run on
an otherwise idle machine (docs/BENCHMARKS.md shows a run); tools/bench/bench.sh
installs and builds, then runs this on the binaries.

  1. ceilings: raw TCP over loopback and the plain synchronous gRPC client
     ("naive gRPC", wire_bench), push and pull, at 64 KiB, 1 MiB and 16 MiB;
  2. ps_bench through real shards: pull, push, the fused pushpull and
     pull+push, 1 and 2 shards, 1 and 2 client threads, over the data plane
     (--transport=tcp) and pushpull over gRPC beside it;
  3. training samples/s of the MLP 784-256-128-10, batch 64 per worker:
     compute alone, the worker loop with no communication (allreduce, one
     worker), async with 1 and 2 workers (each --exchange, f32 and bf16;
     fused f32 over gRPC beside the data plane), bsp and allreduce with 2
     workers, and PyTorch in one process and DDP with 2;
  4. the server's per-byte work (micro_bench, Google Benchmark) against a
     memcpy ceiling measured in the same binary.
Every line ends with its ratio to the ceiling it is compared with. Shards
come from asyncps.cluster (python/package/cluster.py) and the training
results from each ps_worker's --result_json: nothing parses a log.

  tools/bench/bench.py --bin DIR [--quick]
"""

import argparse
import datetime
import os
import re
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", ".."))
from tools import ROOT  # noqa: E402
from asyncps import cluster  # noqa: E402


def field(key, text):
    m = re.search(rf"{re.escape(key)}=([0-9.]+)", text)
    return float(m.group(1)) if m else None


def ratio(a, b):
    return f"{a / b:.2f}" if a is not None and b else "-"


def run(argv):
    return subprocess.run(argv, capture_output=True, text=True,
                          check=True).stdout


class Bench:
    def __init__(self, args):
        self.bin = args.bin
        self.quick = args.quick
        self.secs = 1 if args.quick else 3
        self.sizes = [1 << 20] if args.quick else [1 << 16, 1 << 20, 1 << 24]
        self.steps = 300 if args.quick else 938
        self.work = tempfile.mkdtemp(prefix="bench-")
        self.tcp, self.grpc = {}, {}

    def binary(self, name):
        return os.path.join(self.bin, name)

    def shards(self, n, *flags):
        s = cluster.Shards(self.binary("ps_server"), ready_dir=self.work)
        s.start(n, *flags)
        return s

    def ceilings(self):
        print("## 1. Ceilings (GB/s of payload, one call at a time)")
        for b in self.sizes:
            for op in ("push", "pull"):
                for transport, into in (("tcp", self.tcp), ("grpc", self.grpc)):
                    out = run([self.binary("wire_bench"),
                               f"--transport={transport}", f"--op={op}",
                               f"--bytes={b}", f"--seconds={self.secs}"])
                    into[op, b] = field("gb_per_s", out)
                    if (op, b) == ("push", self.sizes[0]):
                        # What the ceiling is, and the load it ran under.
                        print(out.splitlines()[0])
                print(f"{op:<6} {b:9d} B  raw TCP {self.tcp[op, b]:6.3f} GB/s"
                      f"   naive gRPC {self.grpc[op, b]:6.3f} GB/s   gRPC/TCP "
                      f"{ratio(self.grpc[op, b], self.tcp[op, b])}")
            # A push and a pull of b bytes each: the time of both, 2b bytes.
            for into in (self.tcp, self.grpc):
                into["pp", b] = 2 / (1 / into["push", b] + 1 / into["pull", b])

    def ps_bench(self, servers, op, clients, b, transport="tcp", wire="f32"):
        out = run([self.binary("ps_bench"), f"--servers={servers}",
                   f"--op={op}", f"--clients={clients}", f"--model_bytes={b}",
                   f"--seconds={self.secs}", f"--transport={transport}",
                   f"--wire_dtype={wire}"])
        return field("gb_per_s", out)

    def through_shards(self):
        print("\n## 2. ps_bench through real shards (GB/s of payload; ratios "
              "to the ceilings of the same op and size)")
        for n in (1, 2):
            for b in self.sizes:
                shards = self.shards(n)  # A shard holds one model.
                try:
                    for clients in (1, 2):
                        for op in ("pull", "push", "pushpull", "pull+push"):
                            if op in ("pull", "push") and (n, clients) != (1, 1):
                                continue
                            for transport in ("tcp", "grpc"):
                                if transport == "grpc" and op != "pushpull":
                                    continue
                                gb = self.ps_bench(shards.servers, op, clients,
                                                   b, transport)
                                key = "pp" if op in ("pushpull", "pull+push") \
                                    else op
                                print(f"{op:<9} {transport:<4} {n} shard(s) "
                                      f"{clients} client(s) {b:9d} B  "
                                      f"{gb:6.3f} GB/s   /naive gRPC "
                                      f"{ratio(gb, self.grpc.get((key, b)))}"
                                      f"   /raw TCP "
                                      f"{ratio(gb, self.tcp.get((key, b)))}")
                finally:
                    shards.stop()
            shards = self.shards(n)
            try:
                gb = self.ps_bench(shards.servers, "pushpull", 1, 1 << 20,
                                   wire="bf16")
            finally:
                shards.stop()
            print(f"pushpull  tcp  {n} shard(s) 1 client(s) {1 << 20:9d} B  "
                  f"{gb:6.3f} GB/s of f32 model, bf16 on the wire   "
                  f"/naive gRPC {ratio(gb, self.grpc.get(('pp', 1 << 20)))}")

    def train(self, mode, workers, n, *flags):
        """Samples/s summed over the workers (their --result_json)."""
        shards = self.shards(n, f"--mode={mode}")
        procs, results = [], []
        try:
            for r in range(workers):
                result = os.path.join(self.work, f"w{r}.json")
                results.append(result)
                procs.append(subprocess.Popen(
                    [self.binary("ps_worker"), f"--servers={shards.servers}",
                     f"--rank={r}", f"--num_workers={workers}",
                     f"--mode={mode}", f"--steps={self.steps}",
                     "--log_every=1h", f"--result_json={result}", *flags],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            for p in procs:
                if p.wait() != 0:
                    raise RuntimeError(f"a {mode} worker exited {p.returncode}")
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
            shards.stop()
        return sum(cluster.read_result(f)["samples_per_second"]
                   for f in results)

    def training(self):
        print("\n## 3. Training samples/s, MLP 784-256-128-10, batch 64 per "
              "worker, 1 BLAS thread each")
        out = run([self.binary("gpu_bench"), "--device=cpu", "--batch_size=64",
                   "--blas_threads=1", "--steps=500",
                   "--models=784,256,128,10"])
        compute = float(re.search(r"compute only: ([0-9]+) samples", out)[1])
        loop = self.train("allreduce", 1, 1)
        print(f"{'compute alone (gpu_bench --device=cpu)':<44} {compute:7.0f} "
              "samples/s")
        print(f"{'worker loop, no communication (allreduce, 1)':<44} "
              f"{loop:7.0f} samples/s   /compute {ratio(loop, compute)}")
        two = {}
        for ex in ("fused", "prefetch", "layered"):
            for wire in ("f32", "bf16"):
                if ex == "layered" and wire == "bf16":
                    continue
                flags = (f"--exchange={ex}", f"--wire_dtype={wire}")
                one = self.train("async", 1, 2, *flags)
                two[ex, wire] = self.train("async", 2, 2, *flags)
                print(f"{f'async 1 worker, 2 shards, {ex}, {wire}':<44} "
                      f"{one:7.0f} samples/s   /no-communication loop "
                      f"{ratio(one, loop)}")
        one = self.train("async", 1, 2, "--transport=grpc")
        two["fused", "f32, gRPC"] = self.train("async", 2, 2, "--transport=grpc")
        print(f"{'async 1 worker, 2 shards, fused, f32, gRPC':<44} {one:7.0f} "
              f"samples/s   /no-communication loop {ratio(one, loop)}")
        bsp, ar = self.train("bsp", 2, 2), self.train("allreduce", 2, 2)
        single = ddp = None
        if subprocess.run([sys.executable, "-c", "import torch"],
                          capture_output=True).returncode == 0:
            compare = os.path.join(ROOT, "tools", "bench",
                                   "compare_pytorch.py")
            single = field("samples_per_s", run([sys.executable, compare,
                                                 "--mode=single"]))
            ddp = field("samples_per_s", run([sys.executable, compare,
                                              "--mode=ddp", "--procs=2"]))
        for label, v in (("bsp 2 workers, 2 shards", bsp),
                         ("allreduce 2 workers (Gloo ring)", ar),
                         ("PyTorch 1 process (1 thread)", single),
                         ("PyTorch DDP 2 processes (gloo, 1 thread each)", ddp)):
            print(f"{label:<44} {v if v is None else f'{v:7.0f}'} samples/s")
        for (ex, wire), v in two.items():
            print(f"{f'async 2 workers, 2 shards, {ex}, {wire}':<44} {v:7.0f} "
                  f"samples/s   /allreduce {ratio(v, ar)}   /DDP "
                  f"{ratio(v, ddp)}")

    def server_work(self):
        print("\n## 4. Server work per byte (bytes read + written per second "
              "/ memcpy ceiling)")
        out = subprocess.run(
            [self.binary("micro_bench"),
             f"--benchmark_min_time={0.3 if self.quick else 1.3}"],
            capture_output=True, text=True).stdout
        units = {"G/s": 1, "M/s": 1e-3, "k/s": 1e-6}
        for line in out.splitlines():
            if not line.startswith("BM_"):
                continue
            words = line.split()
            bps = re.search(r"bytes_per_second=([0-9.]+)([GMk]/s)", line)
            ceiling = re.search(r"ceiling_GBps=([0-9.]+)", line)
            if bps and ceiling:
                gb = float(bps[1]) * units[bps[2]]
                print(f"{words[0]:<18} {words[-1]:<16} {gb:7.2f} GB/s   "
                      f"/memcpy {gb / float(ceiling[1]):.2f}")
            else:
                print(f"{words[0]:<18} {words[-1]:<28} {words[1]} {words[2]}")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", required=True,
                   help="ps_server, ps_worker, ps_bench, wire_bench, "
                   "gpu_bench and micro_bench")
    p.add_argument("--quick", action="store_true",
                   help="1 MiB only, shorter runs")
    args = p.parse_args()
    bench = Bench(args)
    now = datetime.datetime.now(datetime.timezone.utc)
    print(f"# asyncps bench, {now:%Y-%m-%dT%H:%MZ}, {os.cpu_count()} cores, "
          f"{os.uname().release}\n")
    try:
        bench.ceilings()
        bench.through_shards()
        bench.training()
        bench.server_work()
    finally:
        shutil.rmtree(bench.work, ignore_errors=True)


if __name__ == "__main__":
    main()
