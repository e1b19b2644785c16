#!/usr/bin/env bash
# Packs the CUDA build for a GPU machine that has the CUDA runtime but not
# Debian's libraries: out/gpu/bin (ps_server, gpu_bench, cuda_backend_test)
# and out/gpu/lib (every shared library they need except glibc, the CUDA
# driver and the CUDA toolkit's own, which the GPU machine has).
# Then, there: tools/gpu_device_run.sh
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh
bazel build --config=cuda //server:ps_server //tools:gpu_bench \
  //tests/worker:cuda_backend_test //tests/worker:gpu_metrics_test
rm -rf out/gpu
mkdir -p out/gpu/bin out/gpu/lib
cp bazel-bin/server/ps_server bazel-bin/tools/gpu_bench \
  bazel-bin/tests/worker/cuda_backend_test \
  bazel-bin/tests/worker/gpu_metrics_test out/gpu/bin/
chmod u+w out/gpu/bin/*
for b in out/gpu/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|\
    libcublas*|libcudart*|libnccl*) ;;
    *) cp -L "$lib" out/gpu/lib/ ;;
  esac
done
du -sh out/gpu
bazel shutdown
