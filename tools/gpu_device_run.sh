#!/usr/bin/env bash
# Runs on the GPU machine, after tools/pack_gpu.sh here: the CUDA tests,
# then the GPU benchmark in fp32, tf32 and bf16. Results go to $OUT (or
# out/gpu/results).
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-out/gpu/results}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/out/gpu/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/gpu.txt"
out/gpu/bin/cuda_backend_test 2>&1 | tee "$out/cuda_backend_test.txt" | tail -n 5
out/gpu/bin/gpu_metrics_test 2>&1 | tee "$out/gpu_metrics_test.txt" | tail -n 5
for p in fp32 tf32 bf16; do
  BIN=out/gpu/bin timeout 150 tools/gpu_bench.sh --device=cuda:0 --precision=$p \
    --steps=20 2>&1 | tee "$out/gpu_bench_$p.txt"
done
