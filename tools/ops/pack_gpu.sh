#!/usr/bin/env bash
# Packs the CUDA build for a GPU machine that has the CUDA runtime but not
# Debian's libraries, into out/gpu (about 45 MB, under the device tool's
# 64 MiB): bundle.tar.xz holds bin/ (ps_server, ps_worker, gpu_bench, the
# CUDA tests) and lib/ (every shared library they need except glibc, the
# CUDA driver and the CUDA toolkit's own, which the GPU machine has); data/
# the Fashion-MNIST IDX files. Then, there: tools/ops/gpu_device_run.sh
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/install_deps.sh
bazel build --config=cuda //server:ps_server //worker:ps_worker \
  //tools/bench:gpu_bench //tests/worker:cuda_backend_test \
  //tests/worker:gpu_metrics_test
stage=$(mktemp -d /tmp/pack_gpu.XXXXXX)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
bins=(server/ps_server worker/ps_worker tools/bench/gpu_bench
  tests/worker/cuda_backend_test tests/worker/gpu_metrics_test)
for b in "${bins[@]}"; do cp "bazel-bin/$b" "$stage/bin/"; done
chmod u+w "$stage"/bin/*
# ldd on the binaries where Bazel put them: tests link the project's own
# libraries as shared objects found through a relative rpath, which a copy
# loses (they are packed into lib/ with the rest).
for b in "${bins[@]}"; do
  ldd "bazel-bin/$b" | awk '/=> \// {print $3}'
done | sort -u | while read -r lib; do
  case "$(basename "$lib")" in
    libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libcuda.so*|\
    libcublas*|libcudart*|libnccl*) ;;
    *) cp -L "$lib" "$stage/lib/" ;;
  esac
done
rm -rf out/gpu
mkdir -p out/gpu/data
if LD_LIBRARY_PATH="$stage/lib:/usr/local/cuda/lib64" ldd "$stage"/bin/* |
  grep "not found"; then
  echo "pack_gpu: a library above is missing from the pack" >&2
  exit 1
fi
tar -C "$stage" -cJf out/gpu/bundle.tar.xz bin lib
cp /usr/share/datasets/fashion-mnist/*.gz out/gpu/data/
du -sh out/gpu
bazel shutdown
