#!/usr/bin/env bash
# Every speed figure of asyncps against its ceiling, measured in one run on
# an otherwise idle machine (docs/BENCHMARKS.md shows a run):
#   1. ceilings: raw TCP over loopback and a naive gRPC unary service
#      (tools/wire_bench), push and pull, at 64 KiB, 1 MiB and 16 MiB;
#   2. ps_bench through real shards: pull, push, the fused pushpull and
#      pull+push, 1 and 2 shards, 1 and 2 client threads, over the data
#      plane (--transport=tcp, the default), and pushpull over gRPC beside it;
#   3. training samples/s of the MLP 784-256-128-10, batch 64 per worker:
#      compute alone, the worker loop with no communication (allreduce, one
#      worker), async with 1 and 2 workers (each --exchange, f32 and bf16;
#      fused f32 over gRPC beside the data plane),
#      bsp and allreduce with 2 workers, and PyTorch (Debian's python3-torch,
#      installed here if missing) in one process and DDP with 2;
#   4. the server's per-byte work (tools/micro_bench, Google Benchmark):
#      each optimizer's apply and the payload codecs, against a memory
#      bandwidth ceiling (a 64 MiB memcpy) measured in the same binary.
# Every line ends with its ratio to the ceiling it is compared with.
#
#   tools/bench.sh [--quick]     # --quick: 1 MiB only, shorter runs
set -uo pipefail
cd "$(dirname "$0")/.."
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1
deploy/install_deps.sh
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench: installing python3-torch for the PyTorch rows" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-torch >/dev/null || echo "bench: no python3-torch; PyTorch rows skipped" >&2
fi
bazel build //server:ps_server //worker:ps_worker //tools:ps_bench \
  //tools:wire_bench //tools:gpu_bench //tools:micro_bench >/dev/null 2>&1 || { echo "build failed"; exit 1; }
bin=$(mktemp -d /tmp/bench.XXXXXX)
cp bazel-bin/server/ps_server bazel-bin/worker/ps_worker bazel-bin/tools/ps_bench \
  bazel-bin/tools/wire_bench bazel-bin/tools/gpu_bench bazel-bin/tools/micro_bench "$bin/"
bazel shutdown >/dev/null 2>&1
source deploy/shards.sh
pids=()
stop_all() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null
  pids=()
}
trap 'stop_all; rm -rf "$bin"' EXIT

secs=3
sizes=(65536 1048576 16777216)
if ((quick)); then secs=1; sizes=(1048576); fi
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf (b > 0 ? "%.2f" : "-"), a / b }'; }

echo "# asyncps bench, $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)"
echo
echo "## 1. Ceilings (GB/s of payload, one call at a time)"
declare -A tcp grpc
for b in "${sizes[@]}"; do
  for op in push pull; do
    t=$("$bin/wire_bench" --transport=tcp --op=$op --bytes=$b --seconds=$secs)
    g=$("$bin/wire_bench" --transport=grpc --op=$op --bytes=$b --seconds=$secs)
    tcp[$op$b]=$(field gb_per_s "$t")
    grpc[$op$b]=$(field gb_per_s "$g")
    printf "%-6s %9d B  raw TCP %6s GB/s   naive gRPC %6s GB/s   gRPC/TCP %s\n" \
      $op $b "${tcp[$op$b]}" "${grpc[$op$b]}" "$(ratio "${grpc[$op$b]}" "${tcp[$op$b]}")"
  done
  # A push and a pull of b bytes each: the time of both, 2b bytes.
  tcp[pp$b]=$(awk -v a="${tcp[push$b]}" -v c="${tcp[pull$b]}" 'BEGIN { printf "%.3f", 2 / (1 / a + 1 / c) }')
  grpc[pp$b]=$(awk -v a="${grpc[push$b]}" -v c="${grpc[pull$b]}" 'BEGIN { printf "%.3f", 2 / (1 / a + 1 / c) }')
done

echo
echo "## 2. ps_bench through real shards (GB/s of payload; ratios to the ceilings of the same op and size)"
# A shard holds one model: fresh shards for every model size.
for shards in 1 2; do
  for b in "${sizes[@]}"; do
    start_shards "$bin" "$bin" $shards >/dev/null || exit 1
    for clients in 1 2; do
      for op in pull push pushpull pull+push; do
        if [[ $op == pull || $op == push ]] && ((shards != 1 || clients != 1)); then continue; fi
        for transport in tcp grpc; do
          if [[ $transport == grpc && $op != pushpull ]]; then continue; fi
          line=$("$bin/ps_bench" --servers="$servers" --op=$op --clients=$clients \
            --model_bytes=$b --seconds=$secs --transport=$transport | grep "^ps_bench")
          gb=$(field gb_per_s "$line")
          key=$op; [[ $op == pushpull || $op == pull+push ]] && key=pp
          printf "%-9s %-4s %d shard(s) %d client(s) %9d B  %6s GB/s   /naive gRPC %s   /raw TCP %s\n" \
            $op $transport $shards $clients $b "$gb" "$(ratio "$gb" "${grpc[$key$b]}")" "$(ratio "$gb" "${tcp[$key$b]}")"
        done
      done
    done
    stop_all
  done
  start_shards "$bin" "$bin" $shards >/dev/null || exit 1
  line=$("$bin/ps_bench" --servers="$servers" --op=pushpull --clients=1 \
    --model_bytes=1048576 --seconds=$secs --wire_dtype=bf16 | grep "^ps_bench")
  gb=$(field gb_per_s "$line")
  printf "pushpull  tcp  %d shard(s) 1 client(s) %9d B  %6s GB/s of f32 model, bf16 on the wire   /naive gRPC %s\n" \
    $shards 1048576 "$gb" "$(ratio "$gb" "${grpc[pp1048576]:-0}")"
  stop_all
done

echo
echo "## 3. Training samples/s, MLP 784-256-128-10, batch 64 per worker, 1 BLAS thread each"
steps=938; ((quick)) && steps=300
train() {  # mode workers shards [worker flags...]: prints total samples/s
  local mode=$1 n=$2 shards=$3
  shift 3
  start_shards "$bin" "$bin" $shards --mode=$mode >/dev/null || return 1
  local wp=()
  for ((r = 0; r < n; r++)); do
    "$bin/ps_worker" --servers="$servers" --rank=$r --num_workers=$n --mode=$mode \
      --steps=$steps --log_every=1h "$@" >"$bin/w$r.out" 2>"$bin/w$r.log" &
    wp+=($!)
  done
  for p in "${wp[@]}"; do wait "$p"; done
  stop_all
  cat "$bin"/w*.out | sed -n 's/.*samples\/s \([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }'
  rm -f "$bin"/w*.out
}
compute=$("$bin/gpu_bench" --device=cpu --batch_size=64 --blas_threads=1 --steps=500 \
  --models=784,256,128,10 | sed -n 's/.*compute only: \([0-9]*\) samples.*/\1/p')
loop=$(train allreduce 1 1)
printf "%-44s %7s samples/s\n" "compute alone (gpu_bench --device=cpu)" "$compute"
printf "%-44s %7s samples/s   /compute %s\n" "worker loop, no communication (allreduce, 1)" "$loop" "$(ratio "$loop" "$compute")"
for ex in fused prefetch layered; do
  for wire in f32 bf16; do
    [[ $ex == layered && $wire == bf16 ]] && continue
    one=$(train async 1 2 --exchange=$ex --wire_dtype=$wire)
    two=$(train async 2 2 --exchange=$ex --wire_dtype=$wire)
    printf "%-44s %7s samples/s   /no-communication loop %s\n" "async 1 worker, 2 shards, $ex, $wire" "$one" "$(ratio "$one" "$loop")"
    eval "async2_${ex}_${wire}=$two"
  done
done
one_grpc=$(train async 1 2 --transport=grpc)
async2_grpc=$(train async 2 2 --transport=grpc)
printf "%-44s %7s samples/s   /no-communication loop %s\n" "async 1 worker, 2 shards, fused, f32, gRPC" "$one_grpc" "$(ratio "$one_grpc" "$loop")"
bsp2=$(train bsp 2 2)
ar2=$(train allreduce 2 2)
ddp=""; single=""
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  single=$(/usr/bin/python3 tools/compare_pytorch.py --mode=single | sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p')
  ddp=$(/usr/bin/python3 tools/compare_pytorch.py --mode=ddp --procs=2 | sed -n 's/.*samples_per_s=\([0-9]*\).*/\1/p')
fi
printf "%-44s %7s samples/s\n" "bsp 2 workers, 2 shards" "$bsp2"
printf "%-44s %7s samples/s\n" "allreduce 2 workers (Gloo ring)" "$ar2"
printf "%-44s %7s samples/s\n" "PyTorch 1 process (1 thread)" "${single:--}"
printf "%-44s %7s samples/s\n" "PyTorch DDP 2 processes (gloo, 1 thread each)" "${ddp:--}"
for ex in fused prefetch layered; do
  for wire in f32 bf16; do
    [[ $ex == layered && $wire == bf16 ]] && continue
    v=async2_${ex}_${wire}
    printf "%-44s %7s samples/s   /allreduce %s   /DDP %s\n" "async 2 workers, 2 shards, $ex, $wire" "${!v}" \
      "$(ratio "${!v}" "$ar2")" "$(ratio "${!v}" "${ddp:-0}")"
  done
done
printf "%-44s %7s samples/s   /allreduce %s   /DDP %s\n" "async 2 workers, 2 shards, fused, f32, gRPC" "$async2_grpc" \
  "$(ratio "$async2_grpc" "$ar2")" "$(ratio "$async2_grpc" "${ddp:-0}")"

echo
echo "## 4. Server work per byte (bytes read + written per second / memcpy ceiling)"
"$bin/micro_bench" --benchmark_min_time=$((quick ? 0 : 1)).3 2>/dev/null | awk '
  /^BM_/ {
    bps = ""; ceil = ""; label = $NF
    for (i = 1; i <= NF; i++) {
      if ($i ~ /^bytes_per_second=/) { v = $i; sub(/bytes_per_second=/, "", v); unit = substr(v, length(v) - 2); sub(/[GMk]\/s$/, "", v); bps = v * (unit == "G/s" ? 1 : unit == "M/s" ? 1e-3 : 1e-6) }
      if ($i ~ /^ceiling_GBps=/) { ceil = $i; sub(/ceiling_GBps=/, "", ceil) }
    }
    if (bps != "" && ceil != "") printf "%-18s %-16s %7.2f GB/s   /memcpy %.2f\n", $1, label, bps, bps / ceil
    else printf "%-18s %-28s %s %s\n", $1, label, $2, $3
  }'
