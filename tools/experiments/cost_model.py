#!/usr/bin/python3
"""A cost model of asyncps training (issue #26): samples/s of W workers
and S shards on links of a given rate, for async through the shards and
for allreduce's ring, from a few calibrated quantities. docs/COST_MODEL.md
says where each comes from and how far off it is.

  tools/experiments/cost_model.py --check    # every measured point: predicted,
                                             # error
  tools/experiments/cost_model.py --answers  # what docs/COST_MODEL.md answers
  tools/experiments/cost_model.py --workers 64 --shards 43 --link 25gbit \\
      --compute_ms 0.6 --batch 512 [--push bf16] [--pull bf16]

Async (the fused exchange): a worker's step takes
  max(compute, link), link = max(up, down) / (eta * rate) * (1 + beta * min/max)
where up and down are the bytes it pushes and pulls a step (both
directions at once cost beta more: TCP's acknowledgements queue behind the
other direction's data in the shaper). Each shard's link carries W/S of
every worker's bytes, and each shard applies W/S of every worker's
gradient; the slowest of the three sets the pace.
Allreduce (gloo's ring, after the backward pass): a step takes
  compute_sync + 2 (W - 1) / W * bytes / (eta * rate).
ssp and bsp (the layered exchange: each layer's push as backward
produces it, then its pull, which the shard may hold): a step takes
  max(compute_layered, link) + (1 - hidden) * min(compute_layered, link),
the pushes overlapping the backward pass of the layers below them and the
pulls not (the next forward pass needs them); hidden = 0.5 is fitted to
the 1 Gbit/s points. compute_layered, calibrated per mode on loopback,
holds the waits for the other worker as well. The shard links and the
apply rate bound it as in async.
"""

import argparse
import math
import re
import sys

# Calibrated on the 2-core development machine (docs/COST_MODEL.md):
ETA = 0.92  # ps_bench pull+push over 1 Gbit/s: 0.91-0.92 of the link.
BETA = 0.23  # Fitted to async, f32 both ways, over 1 Gbit/s.
APPLY_PER_S = 2.0e9  # SGD elements a shard applies a second (micro_bench).
MLP_PARAMS = 235146  # 784-256-128-10.

# Bytes a parameter costs on the wire, per codec (docs/COMPRESSION.md).
WIRE = {"f32": 4.0, "bf16": 2.0, "f16": 2.0,
        "topk:0.01": 0.01 * 8, "onebit": 1.0 / 8}


def rate_bytes(text):
    """'1gbit', '25gbit', '200mbit' -> bytes/s; 'loopback' -> inf."""
    if text == "loopback":
        return math.inf
    m = re.fullmatch(r"([0-9.]+)(g|m)bit", text)
    if not m:
        raise ValueError("link %r (want loopback, 1gbit, 200mbit, ...)" % text)
    return float(m[1]) * (1e9 if m[2] == "g" else 1e6) / 8


def link_seconds(up, down, rate):
    if math.isinf(rate) or max(up, down) == 0:
        return 0.0
    big, small = max(up, down), min(up, down)
    return big / (ETA * rate) * (1 + BETA * small / big)


def async_samples(workers, shards, rate, compute_s, batch, params=MLP_PARAMS,
                  push="f32", pull="f32"):
    """(samples/s, what bounds it)."""
    up, down = params * WIRE[push], params * WIRE[pull]
    worker_step = max(compute_s, link_seconds(up, down, rate))
    return _slowest("compute" if worker_step == compute_s else "worker link",
                    workers / worker_step, shards, up, down, rate, batch,
                    params)


def layered_samples(workers, shards, rate, compute_s, batch,
                    params=MLP_PARAMS, push="f32", pull="f32"):
    """ssp and bsp: (samples/s, what bounds it)."""
    up, down = params * WIRE[push], params * WIRE[pull]
    link = link_seconds(up, down, rate)
    step = max(compute_s, link) + (1 - LAYERED_HIDDEN) * min(compute_s, link)
    return _slowest("compute" if link < compute_s else "worker link",
                    workers / step, shards, up, down, rate, batch, params)


def _slowest(worker_bound, worker_steps_s, shards, up, down, rate, batch,
             params):
    """(samples/s, what bounds it): the workers' own steps a second (named
    `worker_bound`), the shards' links (each carries 1/S of every worker's
    bytes each way per step) and the shards' apply rate, the slowest."""
    bounds = {worker_bound: worker_steps_s}
    shard_s = link_seconds(up / shards, down / shards, rate)
    if shard_s > 0:
        bounds["shard links"] = 1 / shard_s
    bounds["shard apply"] = APPLY_PER_S * shards / params
    what = min(bounds, key=bounds.get)
    return bounds[what] * batch, what


def allreduce_samples(workers, rate, compute_s, batch, params=MLP_PARAMS,
                      wire="f32"):
    ring = 0.0
    if not math.isinf(rate):
        ring = 2 * (workers - 1) / workers * params * WIRE[wire] / (ETA * rate)
    return workers * batch / (compute_s + ring)


# Compute per step, calibrated on loopback (the MLP, batch 64, 2 workers
# and 2 shards sharing 2 cores): async 37,512 samples/s -> 3.41 ms; the
# allreduce step (compute, waiting for the peer, the ring on loopback)
# 15,823 samples/s -> 8.09 ms.
ASYNC_COMPUTE_S = 2 * 64 / 37512
SYNC_COMPUTE_S = 2 * 64 / 15823
# The layered exchange, from the three-link grid's loopback runs (mean of
# 3 seeds): ssp 29,880 samples/s -> 4.28 ms, bsp 22,330 -> 5.73 ms.
LAYERED_COMPUTE_S = {"ssp": 2 * 64 / 29880, "bsp": 2 * 64 / 22330}
LAYERED_HIDDEN = 0.5  # Of the shorter of compute and link; fitted.
# A codec's own CPU time per step on the worker (encoding the push, or the
# ring's conversions to and from half), added to compute: the loopback
# grid's mean step with it less the one without (async --compress=bf16 31,729 and
# top-k 28,030 samples/s against 37,447; allreduce f16 8,319 against
# 15,823). One-bit was not run on loopback: 0 (unknown).
CODEC_CPU_S = {"f32": 0.0, "bf16": 0.62e-3, "topk:0.01": 1.15e-3,
               "onebit": 0.0, "f16": 7.3e-3}

# Every point measured on this machine (docs/COMPRESSION.md "Training over
# it"; docs/EXPERIMENTS.md "Over an emulated 1 Gbit/s link" and "Three
# links"): (source, mode, link, push, pull, measured samples/s of each
# run).
POINTS = [
    ("COMPRESSION", "async", "1gbit", "f32", "f32", [12822, 12583]),
    ("COMPRESSION", "async", "1gbit", "bf16", "f32", [15972, 16106]),
    ("COMPRESSION", "async", "1gbit", "topk:0.01", "f32", [16001, 15622]),
    ("COMPRESSION", "async", "1gbit", "onebit", "f32", [16100, 16319]),
    ("COMPRESSION", "async", "1gbit", "bf16", "bf16", [29878, 26284]),
    ("COMPRESSION", "async", "1gbit", "topk:0.01", "bf16", [29710, 29071]),
    ("COMPRESSION", "async", "1gbit", "onebit", "bf16", [26985, 29983]),
    ("EXPERIMENTS", "async", "loopback", "f32", "f32", [39244, 36100, 37192]),
    ("EXPERIMENTS", "async", "loopback", "topk:0.01", "f32",
     [35984, 31376, 37702]),
    ("EXPERIMENTS", "async", "1gbit", "f32", "f32", [12336, 12520, 12416]),
    ("EXPERIMENTS", "async", "1gbit", "topk:0.01", "f32",
     [14994, 15053, 14741]),
    ("EXPERIMENTS", "async", "1gbit", "bf16", "bf16", [24838, 24445, 24849]),
    ("EXPERIMENTS", "async", "1gbit", "topk:0.01", "bf16",
     [24229, 25288, 25417]),
    ("EXPERIMENTS", "allreduce", "loopback", "f32", "f32",
     [15823, 14707, 20944]),
    ("EXPERIMENTS", "allreduce", "1gbit", "f32", "f32", [8580, 8951, 8838]),
    ("EXPERIMENTS", "allreduce", "1gbit", "f16", "f16", [7000, 7372, 8191]),
    ("EXPERIMENTS", "async", "10gbit", "f32", "f32", [30581, 26698, 30960]),
    ("EXPERIMENTS", "async", "10gbit", "bf16", "bf16", [34937, 29674, 34177]),
    ("EXPERIMENTS", "allreduce", "10gbit", "f32", "f32",
     [11433, 11480, 10338]),
    # The three-link grid (docs/EXPERIMENTS.md "Three links"), 3 seeds each.
    ("GRID", "async", "loopback", "f32", "f32", [38904, 37526, 35912]),
    ("GRID", "async", "loopback", "bf16", "bf16", [41355, 40350, 40005]),
    ("GRID", "ssp", "loopback", "f32", "f32", [30920, 24907, 33812]),
    ("GRID", "bsp", "loopback", "f32", "f32", [25148, 17910, 23932]),
    ("GRID", "allreduce", "loopback", "f32", "f32", [17343, 13366, 13803]),
    ("GRID", "async", "loopback", "bf16", "f32", [38897, 28064, 28227]),
    ("GRID", "ssp", "loopback", "bf16", "f32", [28026, 23822, 21719]),
    ("GRID", "bsp", "loopback", "bf16", "f32", [23145, 17806, 19967]),
    ("GRID", "async", "loopback", "topk:0.01", "f32", [30102, 24651, 29336]),
    ("GRID", "ssp", "loopback", "topk:0.01", "f32", [26098, 20778, 22492]),
    ("GRID", "bsp", "loopback", "topk:0.01", "f32", [20771, 17803, 18406]),
    ("GRID", "allreduce", "loopback", "f16", "f16", [8164, 8607, 8187]),
    ("GRID", "async", "10gbit", "f32", "f32", [30360, 27315, 27626]),
    ("GRID", "async", "10gbit", "bf16", "bf16", [31416, 30505, 32345]),
    ("GRID", "ssp", "10gbit", "f32", "f32", [21658, 19733, 22235]),
    ("GRID", "bsp", "10gbit", "f32", "f32", [17763, 16870, 17139]),
    ("GRID", "allreduce", "10gbit", "f32", "f32", [11185, 11030, 10484]),
    ("GRID", "async", "10gbit", "bf16", "f32", [23021, 26278, 31526]),
    ("GRID", "ssp", "10gbit", "bf16", "f32", [20160, 19817, 26183]),
    ("GRID", "bsp", "10gbit", "bf16", "f32", [18116, 19079, 21761]),
    ("GRID", "async", "10gbit", "topk:0.01", "f32", [25001, 25471, 26805]),
    ("GRID", "ssp", "10gbit", "topk:0.01", "f32", [24077, 22836, 21963]),
    ("GRID", "bsp", "10gbit", "topk:0.01", "f32", [19013, 17428, 18565]),
    ("GRID", "allreduce", "10gbit", "f16", "f16", [8064, 8148, 7444]),
    ("GRID", "async", "1gbit", "f32", "f32", [12353, 12239, 12395]),
    ("GRID", "async", "1gbit", "bf16", "bf16", [26482, 26297, 24992]),
    ("GRID", "ssp", "1gbit", "f32", "f32", [10092, 9976, 9811]),
    ("GRID", "bsp", "1gbit", "f32", "f32", [8965, 8900, 9132]),
    ("GRID", "allreduce", "1gbit", "f32", "f32", [8988, 8820, 9108]),
    ("GRID", "async", "1gbit", "bf16", "f32", [14951, 14827, 14858]),
    ("GRID", "ssp", "1gbit", "bf16", "f32", [12867, 13092, 12749]),
    ("GRID", "bsp", "1gbit", "bf16", "f32", [11576, 11026, 11453]),
    ("GRID", "async", "1gbit", "topk:0.01", "f32", [14859, 14778, 14922]),
    ("GRID", "ssp", "1gbit", "topk:0.01", "f32", [13328, 13923, 13570]),
    ("GRID", "bsp", "1gbit", "topk:0.01", "f32", [11010, 11548, 11436]),
    ("GRID", "allreduce", "1gbit", "f16", "f16", [7851, 7710, 7715]),
]


def predict(mode, link, push, pull):
    rate = rate_bytes(link)
    # A 16-bit wire both ways (--wire_dtype) converts as it copies: no
    # encoding pass of its own, unlike a codec on the push alone.
    codec = CODEC_CPU_S[push] if mode == "allreduce" or pull == "f32" else 0
    if mode == "async":
        return async_samples(2, 2, rate, ASYNC_COMPUTE_S + codec, 64,
                             push=push, pull=pull)[0]
    if mode in LAYERED_COMPUTE_S:
        return layered_samples(2, 2, rate, LAYERED_COMPUTE_S[mode] + codec,
                               64, push=push, pull=pull)[0]
    return allreduce_samples(2, rate, SYNC_COMPUTE_S + codec, 64, wire=push)


def check():
    """Prints each point's prediction and error; returns the errors."""
    errors = []
    print("| source | mode | link | push | pull | measured | predicted | "
          "error |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for source, mode, link, push, pull, runs in POINTS:
        p = predict(mode, link, push, pull)
        mean = sum(runs) / len(runs)
        err = (p - mean) / mean
        errors.append(err)
        print("| %s | %s | %s | %s | %s | %s | %.0f | %+.0f %% |" % (
            source, mode, link, push, pull,
            " / ".join("{:,}".format(r) for r in runs), p, 100 * err))
    worst = max(errors, key=abs)
    within = sum(abs(e) <= 0.15 for e in errors)
    print("%d points; %d within 15 %%; worst %+.0f %%; median |error| %.0f %%"
          % (len(errors), within, 100 * worst,
             100 * sorted(abs(e) for e in errors)[len(errors) // 2]))
    return errors


def answers():
    # A GPU worker of the MLP at batch 512: 0.55-0.70 ms a step computing
    # alone on an H200 (docs/GPU.md); 0.6 ms.
    gpu_step, batch, w = 0.6e-3, 512, 64
    rate = rate_bytes("25gbit")
    print("64 GPU workers (the MLP, batch 512, 0.6 ms a step), 25 Gbit/s:")
    for push, pull in (("f32", "f32"), ("bf16", "bf16"),
                       ("topk:0.01", "bf16")):
        want = w / gpu_step * batch  # Every worker at its compute rate.
        shards = 1
        while async_samples(w, shards, rate, gpu_step, batch, push=push,
                            pull=pull)[0] < 0.999 * want and shards < 1000:
            shards += 1
        got, what = async_samples(w, shards, rate, gpu_step, batch,
                                  push=push, pull=pull)
        print("  push %s, pull %s: %d shards (%.2f M samples/s, %s-bound)"
              % (push, pull, shards, got / 1e6, what))
    print("async against allreduce, the MLP on 1 Gbit/s, 64 workers "
          "(samples/s; enough shards):")
    rate = rate_bytes("1gbit")
    for compute_ms in (3.4, 10, 30, 100):
        a, what = async_samples(64, 64, rate, compute_ms / 1e3, 64,
                                push="topk:0.01", pull="bf16")
        r = allreduce_samples(64, rate, compute_ms / 1e3, 64, wire="f16")
        print("  compute %5.1f ms a step: async %8.0f (%s), allreduce f16 "
              "%8.0f, ratio %.2f" % (compute_ms, a, what, r, a / r))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true")
    p.add_argument("--answers", action="store_true")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shards", type=int, default=2)
    p.add_argument("--link", default="1gbit")
    p.add_argument("--compute_ms", type=float, default=1e3 * ASYNC_COMPUTE_S)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--params", type=int, default=MLP_PARAMS)
    p.add_argument("--push", default="f32", choices=sorted(WIRE))
    p.add_argument("--pull", default="f32", choices=["f32", "bf16", "f16"])
    a = p.parse_args()
    if a.check:
        check()
        return 0
    if a.answers:
        answers()
        return 0
    if a.workers < 1 or a.shards < 1 or a.batch < 1 or a.compute_ms <= 0:
        p.error("--workers, --shards, --batch and --compute_ms must be > 0")
    try:
        rate = rate_bytes(a.link)
    except ValueError as e:
        p.error(str(e))
    s, what = async_samples(a.workers, a.shards, rate, a.compute_ms / 1e3,
                            a.batch, a.params, a.push, a.pull)
    r = allreduce_samples(a.workers, rate, a.compute_ms / 1e3, a.batch,
                          a.params, "f16" if a.push != "f32" else "f32")
    print("async: %.0f samples/s (%s-bound); allreduce: %.0f samples/s"
          % (s, what, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
