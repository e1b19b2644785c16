#!/usr/bin/env bash
# Runs gpu_bench against two local ps_server shards on 127.0.0.1.
#
#   tools/bench/gpu_bench.sh [gpu_bench flags...]
#     e.g. --device=cuda:0 --precision=bf16
#
# BIN (default: build with --config=cuda into bazel-bin) names a folder
# holding ps_server and gpu_bench, for machines without Bazel: copy both
# there with the shared libraries `ldd` lists and set LD_LIBRARY_PATH.
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/ops/gpu_binaries.sh
gpu_binaries gpu_bench //server:ps_server //tools/bench:gpu_bench
models="784,256,128,10;4096,4096,4096,10"
args=()
for a in "$@"; do
  case "$a" in
    --models=*) models="${a#--models=}" ;;
    *) args+=("$a") ;;
  esac
done
# A shard holds one model, so each model gets fresh servers (shards from
# python/package/cluster.py, which prints their addresses first).
IFS=';' read -ra model_list <<<"$models"
for model in "${model_list[@]}"; do
  python3 python/package/cluster.py --ps_server="$BIN/ps_server" \
    --shards=2 --server_flag=--max_message_bytes=268435456 -- \
    "$BIN/gpu_bench" --servers={servers} --models="$model" \
    ${args[@]+"${args[@]}"} | tail -n +2
  ((PIPESTATUS[0] == 0)) || exit 1
done
