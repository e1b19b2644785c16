#!/usr/bin/env bash
# What /metrics costs training: one shard and one worker train the same
# number of steps (a) without metrics ("off"), (b) with --metrics_port on
# both and nobody scraping ("idle"), (c) both scraped once a second, more
# often than Prometheus' usual 5-15 s ("1/s"), (d) both scraped in a tight
# loop of curl processes ("flood": the cost of the scrapes, and of curl
# itself, on the same cores). Prints each variant's samples/s per
# repetition, the median, and the ratio of each median to (a)'s.
#   tools/bench/metrics_bench.sh [--reps N] [--steps N]
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=5
steps=4000
while (($#)); do
  case "$1" in
    --reps) reps="$2"; shift 2 ;;
    --steps) steps="$2"; shift 2 ;;
    *) echo "metrics_bench.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
deploy/install_deps.sh
bazel build --noshow_progress //server:ps_server //worker:ps_worker
bin=$(mktemp -d /tmp/metrics_bench.XXXXXX)
cp bazel-bin/server/ps_server bazel-bin/worker/ps_worker "$bin/"
bazel shutdown

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT
free_ports() {
  /usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])'
}

# run VARIANT: trains `steps` steps; prints the worker's samples/s and the
# scrapes done meanwhile.
run() {
  local variant=$1 shard_port worker_port scraper="" scrapes=0
  read -r shard_port worker_port < <(free_ports)
  pids=()
  local metrics_base=0 wflags=() servers
  if [[ $variant != off ]]; then
    metrics_base=$shard_port
    wflags=(--metrics_port="$worker_port")
  fi
  # The shards' launcher prints the servers line once they serve.
  exec {shards_fd}< <(exec python3 python/package/cluster.py \
    --ps_server="$bin/ps_server" --metrics_base="$metrics_base")
  pids=($!)
  read -r servers <&"$shards_fd" || exit 1
  if [[ $variant == 1/s || $variant == flood ]]; then
    (
      n=0
      while true; do
        curl -s -o /dev/null "http://127.0.0.1:$shard_port/metrics" || true
        curl -s -o /dev/null "http://127.0.0.1:$worker_port/metrics" || true
        n=$((n + 2))
        echo $n >"$bin/scrapes"
        if [[ $variant == 1/s ]]; then sleep 1; fi
      done
    ) &
    scraper=$!
  fi
  "$bin/ps_worker" --servers="$servers" --steps="$steps" --seed=1 \
    --result_json="$bin/result.json" ${wflags[@]+"${wflags[@]}"} \
    >/dev/null 2>&1
  if [[ -n $scraper ]]; then
    kill "$scraper" 2>/dev/null || true
    wait "$scraper" 2>/dev/null || true
    scrapes=$(cat "$bin/scrapes" 2>/dev/null || echo 0)
  fi
  cleanup
  exec {shards_fd}<&-
  local rate
  rate=$(python3 -c 'import json, sys
print(round(json.load(open(sys.argv[1]))["samples_per_second"]))' "$bin/result.json")
  echo "$rate $scrapes"
}

declare -A all
echo "variant   rep  samples/s  scrapes"
for ((r = 1; r <= reps; r++)); do
  # Interleaved, so drift of the machine spreads over all three.
  for v in off idle 1/s flood; do
    read -r rate scrapes < <(run $v)
    all[$v]+="$rate "
    printf "%-8s %4d %10s %8s\n" "$v" "$r" "$rate" "$scrapes"
  done
done
median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
off=$(echo "${all[off]}" | median)
for v in off idle 1/s flood; do
  m=$(echo "${all[$v]}" | median)
  awk -v v="$v" -v m="$m" -v o="$off" -v all="${all[$v]}" \
    'BEGIN {printf "%-8s median %8.0f samples/s  %.3fx of no metrics  (runs: %s)\n", v, m, m / o, all}'
done
