#!/usr/bin/env bash
# Runs gpu_bench against two local ps_server shards on 127.0.0.1.
#
#   tools/gpu_bench.sh [gpu_bench flags...]      e.g. --device=cuda:0 --precision=bf16
#
# BIN (default: build with --config=cuda into bazel-bin) names a folder
# holding ps_server and gpu_bench, for machines without Bazel: copy both
# there with the shared libraries `ldd` lists and set LD_LIBRARY_PATH.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ -z "${BIN:-}" ]]; then
  deploy/install_deps.sh
  config=()
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then config=(--config=cuda); fi
  bazel build "${config[@]}" //server:ps_server //tools:gpu_bench
  BIN=$(mktemp -d /tmp/gpu_bench.XXXXXX)
  cp bazel-bin/server/ps_server bazel-bin/tools/gpu_bench "$BIN/"
  bazel shutdown
fi
models="784,256,128,10;4096,4096,4096,10"
args=()
for a in "$@"; do
  case "$a" in
    --models=*) models="${a#--models=}" ;;
    *) args+=("$a") ;;
  esac
done
source deploy/shards.sh
pids=()
stop_servers() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
trap stop_servers EXIT
# A shard holds one model, so each model gets fresh servers.
IFS=';' read -ra model_list <<<"$models"
for model in "${model_list[@]}"; do
  start_shards "$BIN" "$BIN" 2 --max_message_bytes=268435456 || exit 1
  "$BIN/gpu_bench" --servers="$servers" --models="$model" ${args[@]+"${args[@]}"}
  stop_servers
done
