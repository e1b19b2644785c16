#!/usr/bin/env bash
# Runs on the GPU machine, after tools/ops/pack_gpu.sh here: the CUDA tests
# (then the kernel test again under compute-sanitizer where it works), the
# GPU benchmark in fp32, tf32 and bf16, and Fashion-MNIST training through
# two shards with the workers on the GPU and, for comparison, on the CPU;
# and what gradient compression buys a GPU worker that waits on the servers
# (the wide model through two shards per codec, two rounds, and training
# with top-k and one-bit). Results go to $OUT (or out/gpu/results), eight
# files.
#
#   tools/ops/gpu_device_run.sh [tests] [bench] [train] [compress] [sanitizer]
#                                                          (default: all)
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -uo pipefail
parts=" ${*:-tests bench train compress sanitizer} "
want() { [[ "$parts" == *" $1 "* ]]; }
cd "$(dirname "$0")/../.."
out="${OUT:-out/gpu/results}"
mkdir -p "$out"
# Unpacked outside out/gpu, which must stay small enough to travel.
pack=$(mktemp -d /tmp/asyncps_gpu.XXXXXX)
trap 'rm -rf "$pack"' EXIT
tar -C "$pack" -xJf out/gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$pack/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# The CUDA libraries the pack leaves out (cuBLAS, the runtime, NCCL) from
# wherever this machine keeps them, when not in the toolkit's folder.
for lib in $(ldd $pack/bin/* | awk '/not found/ {print $1}' | sort -u); do
  found=$(find / -xdev -name "$lib" -print -quit 2>/dev/null)
  if [[ -n "$found" ]]; then
    LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$found")"
  else
    echo "gpu_device_run: $lib is not on this machine" >&2
  fi
done
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
    --format=csv
  nproc
} 2>&1 | tee "$out/gpu.txt"
want tests && {
  timeout 120 $pack/bin/cuda_backend_test 2>&1
  echo "cuda_backend_test exit $?"
  timeout 60 $pack/bin/gpu_metrics_test 2>&1
  echo "gpu_metrics_test exit $?"
} >"$out/tests.txt"
want tests && grep -E "PASSED|FAILED|SKIPPED|exit|tensor" "$out/tests.txt"
want bench && for p in fp32 tf32 bf16; do
  BIN=$pack/bin timeout 80 tools/bench/gpu_bench.sh --device=cuda:0 \
    --precision=$p --steps=20 2>&1 | tee "$out/gpu_bench_$p.txt"
done
want train && {
  for run in "cuda:0 fp32 f32" "cuda:0 bf16 f32" "cuda:0 bf16 bf16" \
    "cpu fp32 f32"; do
    read -r device precision wire <<<"$run"
    echo "== 2 workers on $device, $precision, wire $wire, 3 epochs, batch 128"
    BIN=$pack/bin DATA=out/gpu/data timeout 60 tools/experiments/gpu_train.sh \
      --workers=2 --device="$device" --precision="$precision" --epochs=3 \
      --wire_dtype="$wire" --batch_size=128 --blas_threads=4 --lr=0.05 \
      --seed=7 2>&1
    echo "exit $?"
  done
} | tee "$out/train.txt"
want compress && {
  for round in 1 2; do
    for c in none bf16 topk:0.01 onebit; do
      echo "== round $round, --compress=$c"
      BIN=$pack/bin timeout 60 tools/bench/gpu_bench.sh --device=cuda:0 \
        --precision=tf32 --steps=20 --models="4096,4096,4096,10" \
        --compress=$c 2>&1 | grep -E "copies|through|rror|fail"
    done
  done
  # One-bit diverges at 0.05 (docs/COMPRESSION.md).
  for run in "topk:0.01 0.05" "onebit 0.01"; do
    read -r c lr <<<"$run"
    echo "== 2 workers on cuda:0, fp32, --compress=$c, lr $lr, 3 epochs, batch 128"
    BIN=$pack/bin DATA=out/gpu/data timeout 60 tools/experiments/gpu_train.sh \
      --workers=2 --device=cuda:0 --precision=fp32 --epochs=3 \
      --compress=$c --batch_size=128 --blas_threads=4 --lr=$lr --seed=7 2>&1
    echo "exit $?"
  done
} | tee "$out/compress.txt"
# Last, as it may not work on every machine: the kernels under memcheck.
want sanitizer && {
  sanitizer=$(command -v compute-sanitizer ||
    ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
  if [[ -n "$sanitizer" ]]; then
    timeout 90 "$sanitizer" --tool memcheck --error-exitcode 3 \
      $pack/bin/cuda_backend_test --gtest_brief=1 2>&1 | tail -n 25
    echo "compute-sanitizer memcheck exit ${PIPESTATUS[0]}"
  fi
} 2>&1 | tee "$out/sanitizer.txt"
exit 0
