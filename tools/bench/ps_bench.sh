#!/usr/bin/env bash
# Runs ps_bench against two local ps_server shards on 127.0.0.1.
#   tools/bench/ps_bench.sh [ps_bench flags...]        e.g. --clients=4
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/install_deps.sh
bazel build //server:ps_server //tools/bench:ps_bench
bin=$(mktemp -d /tmp/ps_bench.XXXXXX)
cp bazel-bin/server/ps_server bazel-bin/tools/bench/ps_bench "$bin/"
bazel shutdown
trap 'rm -rf "$bin"' EXIT
python3 python/package/cluster.py --ps_server="$bin/ps_server" \
  --shards=2 -- "$bin/ps_bench" --servers={servers} "$@" | tail -n +2
