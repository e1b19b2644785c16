#!/usr/bin/env bash
# Runs ps_bench against two local ps_server shards on 127.0.0.1.
#   tools/ps_bench.sh [ps_bench flags...]        e.g. --clients=4
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/install_deps.sh
bazel build //server:ps_server //tools:ps_bench
bin=$(mktemp -d /tmp/ps_bench.XXXXXX)
cp bazel-bin/server/ps_server bazel-bin/tools/ps_bench "$bin/"
bazel shutdown
source deploy/shards.sh
pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait' EXIT
start_shards "$bin" "$bin" 2 || exit 1
"$bin/ps_bench" --servers="$servers" "$@"
