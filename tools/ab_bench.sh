#!/usr/bin/env bash
# A/B training speed of two builds of ps_server + ps_worker on this machine,
# interleaved so that the machine's drift falls on both alike:
#   tools/ab_bench.sh OLD_BIN_DIR NEW_BIN_DIR [reps]
# Each BIN_DIR holds ps_server and ps_worker (copy them out of bazel-bin
# after building each commit). Prints samples/s summed over the workers for
# 1 async worker (fused, layered) and 2 (fused), 2 shards, and new/old.
set -uo pipefail
cd "$(dirname "$0")/.."
old=$1 new=$2 reps=${3:-3}
work=$(mktemp -d /tmp/ab_bench.XXXXXX)
source deploy/shards.sh
pids=()
stop_all() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; pids=(); }
trap 'stop_all; rm -rf "$work"' EXIT
run() {  # bindir workers exchange
  local bin=$1 n=$2 ex=$3
  start_shards "$bin" "$work" 2 --mode=async >/dev/null || return 1
  local wp=()
  for ((r = 0; r < n; r++)); do
    "$bin/ps_worker" --servers="$servers" --rank=$r --num_workers=$n --mode=async \
      --exchange=$ex --steps=938 --log_every=1h >"$work/w$r.out" 2>"$work/w$r.log" &
    wp+=($!)
  done
  for p in "${wp[@]}"; do wait "$p"; done
  stop_all
  cat "$work"/w*.out | sed -n 's/.*samples\/s \([0-9]*\).*/\1/p' | awk '{ s += $1 } END { print s }'
  rm -f "$work"/w*.out
}
for ((rep = 1; rep <= reps; rep++)); do
  for cfg in "1 fused" "1 layered" "2 fused"; do
    set -- $cfg
    o=$(run "$old" $1 $2)
    n=$(run "$new" $1 $2)
    echo "rep $rep workers $1 $2: old $o new $n new/old $(awk -v a="$n" -v b="$o" 'BEGIN { printf "%.2f", a / b }')"
  done
done
