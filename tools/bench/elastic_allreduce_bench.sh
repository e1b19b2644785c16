#!/usr/bin/env bash
# What an elastic allreduce job's per-step vote costs: a fixed job (ps_server
# --mode=allreduce) and an elastic one (--elastic), 2 ps_workers of 600
# steps of batch 32 each, in interleaved pairs so the machine's drift falls
# on both alike:
#   tools/bench/elastic_allreduce_bench.sh [BIN_DIR] [pairs]
# BIN_DIR holds ps_server and ps_worker (default bazel-bin's). Prints each
# pair's seconds (rank 0's training time) and elastic/fixed.
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${1:-bazel-bin}
pairs=${2:-5}
server=$bin/server/ps_server worker=$bin/worker/ps_worker
[[ -x $server ]] || server=$bin/ps_server
[[ -x $worker ]] || worker=$bin/ps_worker
work=$(mktemp -d /tmp/elastic_allreduce_bench.XXXXXX)
pids=()
trap 'kill "${pids[@]}" 2>/dev/null; rm -rf "$work"' EXIT

run() {  # extra server flags; prints rank 0's seconds
  rm -f "$work"/ready "$work"/w*.json
  "$server" --port=0 --ready_file="$work/ready" --mode=allreduce \
    --num_workers=2 "$@" >"$work/server.log" 2>&1 &
  pids=($!)
  for ((i = 0; i < 200; i++)); do
    [[ -s $work/ready ]] && break
    sleep 0.05
  done
  local port
  port=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["port"])' \
    "$work/ready")
  local wp=()
  for r in 0 1; do
    "$worker" --servers=127.0.0.1:$port --rank=$r --num_workers=2 \
      --mode=allreduce --steps=600 --max_train_examples=2000 --batch_size=32 \
      --log_every=1h --result_json="$work/w$r.json" >"$work/w$r.log" 2>&1 &
    wp+=($!)
  done
  for p in "${wp[@]}"; do wait "$p"; done
  kill "${pids[0]}"
  wait "${pids[0]}" 2>/dev/null || true
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["seconds"])' \
    "$work/w0.json"
}

echo "pair fixed_s elastic_s elastic/fixed"
for ((p = 1; p <= pairs; p++)); do
  fixed=$(run)
  elastic=$(run --elastic)
  echo "$p $fixed $elastic $(python3 -c "print(round($elastic / $fixed, 2))")"
done
