#!/usr/bin/env bash
# Builds what is missing of the cluster's images, from binaries bazel built
# on this machine:
#   asyncps/debian:12       base (base_image.sh; once)
#   asyncps/runtime:latest  ps_server, ps_worker, psctl (Dockerfile)
#   asyncps/prometheus:latest  Debian's Prometheus (Dockerfile.prometheus; once)
#   asyncps/etcd:latest     Debian's etcd, for replicated shards (Dockerfile.etcd;
#                           once)
#   asyncps/runtime-cuda:latest  with --cuda (Dockerfile.cuda)
# The runtime image is rebuilt every time; Docker's layer cache makes that
# a copy of the binaries when only they changed.
#   deploy/docker/build_images.sh BAZEL_BIN [--cuda CUDA_WORKER CUDA_LIB_DIR]
# BAZEL_BIN holds server/ps_server, worker/ps_worker, tools/psctl;
# CUDA_WORKER is a ps_worker built with --config=cuda, CUDA_LIB_DIR the
# toolkit's libraries (cudart, cuBLAS, NCCL).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=$1
shift
ctx=$(mktemp -d /tmp/asyncps-image.XXXXXX)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/bin"
cp "$bin/server/ps_server" "$bin/worker/ps_worker" "$bin/tools/psctl" "$ctx/bin/"

# Symbols stay (for stack traces); debug info goes.
strip --strip-debug "$ctx"/bin/*

"$here/base_image.sh"
docker build -q -t asyncps/runtime:latest -f "$here/Dockerfile" "$ctx" >/dev/null
echo "== asyncps/runtime:latest: $(docker image inspect -f '{{.Size}}' asyncps/runtime:latest | awk '{printf "%.0f MB", $1 / 1e6}')"
if ! docker image inspect asyncps/prometheus:latest >/dev/null 2>&1; then
  docker build -q -t asyncps/prometheus:latest -f "$here/Dockerfile.prometheus" \
    "$here" >/dev/null
fi
echo "== asyncps/prometheus:latest: $(docker image inspect -f '{{.Size}}' asyncps/prometheus:latest | awk '{printf "%.0f MB", $1 / 1e6}')"
if ! docker image inspect asyncps/etcd:latest >/dev/null 2>&1; then
  docker build -q -t asyncps/etcd:latest -f "$here/Dockerfile.etcd" \
    "$here" >/dev/null
fi
echo "== asyncps/etcd:latest: $(docker image inspect -f '{{.Size}}' asyncps/etcd:latest | awk '{printf "%.0f MB", $1 / 1e6}')"
if [[ "${1:-}" == --cuda ]]; then
  mkdir -p "$ctx/cuda"
  cp "$2" "$ctx/bin/ps_worker"
  for lib in libcudart libcublas libcublasLt libnccl; do
    cp -L "$3"/$lib.so.* "$ctx/cuda/"
  done
  docker build -q -t asyncps/runtime-cuda:latest -f "$here/Dockerfile.cuda" "$ctx" >/dev/null
  echo "== asyncps/runtime-cuda:latest built"
fi
