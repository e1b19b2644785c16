#!/usr/bin/env bash
# A/B training speed of two builds of ps_server + ps_worker on this machine,
# interleaved so that the machine's drift falls on both alike:
#   tools/bench/ab_bench.sh OLD_BIN_DIR NEW_BIN_DIR [reps]
# Each BIN_DIR holds ps_server and ps_worker (copy them out of bazel-bin
# after building each commit). Prints samples/s summed over the workers for
# 1 async worker (fused, layered) and 2 (fused), 2 shards, and new/old.
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -uo pipefail
cd "$(dirname "$0")/../.."
# Runs inside python/package/cluster.py (the shards' launcher): starts
# $2 workers of build $1 with --exchange=$3 and sums their --result_json.
if [[ "${AB_WORKERS:-}" == 1 ]]; then
  bin=$1 n=$2 ex=$3 work=$4
  wp=()
  for ((r = 0; r < n; r++)); do
    "$bin/ps_worker" --servers="$ASYNCPS_SERVERS" --rank=$r --num_workers=$n \
      --mode=async --exchange=$ex --steps=938 --log_every=1h \
      --result_json="$work/w$r.json" >/dev/null 2>"$work/w$r.log" &
    wp+=($!)
  done
  for p in "${wp[@]}"; do wait "$p" || exit 1; done
  exec python3 -c 'import json, sys
print(round(sum(json.load(open(f))["samples_per_second"] for f in sys.argv[1:])))' "$work"/w*.json
fi
old=$1 new=$2 reps=${3:-3}
work=$(mktemp -d /tmp/ab_bench.XXXXXX)
trap 'rm -rf "$work"' EXIT
run() {  # bindir workers exchange
  rm -f "$work"/w*.json
  AB_WORKERS=1 python3 python/package/cluster.py --ps_server="$1/ps_server" \
    --shards=2 --mode=async -- "$PWD/tools/bench/ab_bench.sh" "$1" "$2" "$3" \
    "$work" | tail -n 1
}
for ((rep = 1; rep <= reps; rep++)); do
  for cfg in "1 fused" "1 layered" "2 fused"; do
    set -- $cfg
    o=$(run "$old" $1 $2)
    n=$(run "$new" $1 $2)
    echo "rep $rep workers $1 $2: old $o new $n new/old $(awk -v a="$n" -v b="$o" 'BEGIN { printf "%.2f", a / b }')"
  done
done
