#!/usr/bin/env bash
# A chaos run: the same training job twice on 127.0.0.1, undisturbed and
# then with random shards and workers SIGKILLed and restarted (same flags,
# same port) every few seconds for a bounded time. Reports each run's test
# accuracy and wall time, what was killed, and whether every worker
# finished (exit 0). docs/RELIABILITY.md gives measured results.
#
#   tools/chaos.sh [--mode async] [--shards 2] [--workers 2] [--epochs 6]
#                  [--slowdown 3] [--seconds 40] [--every 4] [--seed 1]
#                  [--seeds A-B] [--plan s,w,...] [--checkpoint_every 2s]
#                  [--bin DIR] [--out DIR]
#
# --checkpoint_every off runs the shards without checkpoints: a restarted
# shard then gets its weights back from a worker's copy. --seeds A-B runs
# the undisturbed job once and the chaos run once per seed (the seed picks
# the victims; the data order stays --seed's), then a summary line.
# --plan kills in that order (s: a shard, w: a worker, picked by the seed)
# every --every seconds (fractions allowed) until the plan is done. --bin
# takes ps_server and ps_worker from DIR instead of building them.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=async shards=2 workers=2 epochs=6 slowdown=3 seconds=40 every=4 seed=1
checkpoint_every=2s out="" seeds="" plan="" bin=""
usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --mode) mode="$2"; shift 2 ;;
    --shards) shards="$2"; shift 2 ;;
    --workers) workers="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --slowdown) slowdown="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --every) every="$2"; shift 2 ;;
    --seed) seed="$2"; shift 2 ;;
    --checkpoint_every) checkpoint_every="$2"; shift 2 ;;
    --seeds) seeds="$2"; shift 2 ;;
    --plan) plan="$2"; shift 2 ;;
    --bin) bin="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "chaos.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in shards workers epochs seconds seed; do
  if ! [[ "${!v}" =~ ^[0-9]+$ ]] || ((${!v} < 1)); then
    echo "chaos.sh: --$v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done
if ! [[ "$every" =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
  echo "chaos.sh: --every must be a positive number of seconds, not '$every'" >&2
  exit 2
fi
first_seed=$seed last_seed=$seed
if [[ -n "$seeds" ]]; then
  if ! [[ "$seeds" =~ ^([0-9]+)-([0-9]+)$ ]] ||
    ((BASH_REMATCH[1] < 1 || BASH_REMATCH[2] < BASH_REMATCH[1])); then
    echo "chaos.sh: --seeds must be A-B with 1 <= A <= B, not '$seeds'" >&2
    exit 2
  fi
  first_seed=${BASH_REMATCH[1]} last_seed=${BASH_REMATCH[2]}
fi
kinds=()
if [[ -n "$plan" ]]; then
  IFS=, read -r -a kinds <<<"$plan"
  for k in "${kinds[@]}"; do
    if [[ "$k" != s && "$k" != w ]]; then
      echo "chaos.sh: --plan is a comma list of s (shard) and w (worker), not '$plan'" >&2
      exit 2
    fi
  done
fi
if [[ -z "$out" ]]; then out=$(mktemp -d /tmp/asyncps-chaos.XXXXXX); fi
mkdir -p "$out"

if [[ -z "$bin" ]]; then
  bazel build --noshow_progress //server:ps_server //worker:ps_worker >&2
  built=$(bazel info bazel-bin 2>/dev/null)
  bin="$out/bin"
  mkdir -p "$bin"
  rm -f "$bin/ps_server" "$bin/ps_worker"
  cp "$built/server/ps_server" "$built/worker/ps_worker" "$bin/"
fi

pids=()
cleanup() {
  for p in "${pids[@]}" "${shard_pid[@]:-}" "${worker_pid[@]:-}"; do
    [[ -n "$p" ]] && kill -KILL "$p" 2>/dev/null || true
  done
  wait 2>/dev/null || true
}
trap cleanup EXIT

server_flags=(--host=127.0.0.1 --mode="$mode" --num_shards="$shards"
  --worker_timeout=3s)
worker_flags=(--mode="$mode" --num_workers="$workers" --epochs="$epochs"
  --slowdown="$slowdown" --seed="$seed" --log_every=2s --heartbeat_every=500ms
  --optimizer=sgd --lr=0.1)

# start_shard RUN S PORT: shard S of run RUN on PORT (0: a free one); sets
# shard_pid[S] and shard_port[S].
start_shard() {
  local run=$1 s=$2 port=$3 line
  local ckpt=()
  if [[ "$checkpoint_every" != off ]]; then
    mkdir -p "$out/$run/ckpt"
    ckpt=(--checkpoint_dir="$out/$run/ckpt" --checkpoint_every="$checkpoint_every")
  fi
  "$bin/ps_server" "${server_flags[@]}" --shard="$s" --port="$port" \
    ${ckpt[@]+"${ckpt[@]}"} >"$out/$run/server$s.out" 2>>"$out/$run/server$s.log" &
  shard_pid[$s]=$!
  line=$(timeout 30 tail -n +1 -f "$out/$run/server$s.out" |
    grep -m1 "listening on" || true)
  [[ -n "$line" ]] || { echo "shard $s did not start" >&2; return 1; }
  shard_port[$s]=${line##*:}
}

start_worker() {
  local run=$1 r=$2
  "$bin/ps_worker" --servers="$servers" --rank="$r" "${worker_flags[@]}" \
    >>"$out/$run/worker$r.out" 2>>"$out/$run/worker$r.log" &
  worker_pid[$r]=$!
}

# run NAME CHAOS: trains once; with CHAOS=1 kills and restarts processes.
# Prints (and leaves in $result) "NAME accuracy A seconds T kills K
# (shards S, workers W) failed_workers F".
run() {
  local name=$1 chaos=$2
  mkdir -p "$out/$name"
  shard_pid=() shard_port=() worker_pid=()
  local s r
  for ((s = 0; s < shards; s++)); do start_shard "$name" "$s" 0; done
  servers=""
  for ((s = 0; s < shards; s++)); do
    servers+="${servers:+,}127.0.0.1:${shard_port[$s]}"
  done
  local start=$SECONDS kills=0 shard_kills=0 worker_kills=0
  for ((r = 0; r < workers; r++)); do start_worker "$name" "$r"; done
  if ((chaos)); then
    RANDOM=$kill_seed
    local until=$((SECONDS + seconds)) victim next=0
    while ((SECONDS < until)); do
      if ((${#kinds[@]} > 0 && next >= ${#kinds[@]})); then break; fi
      sleep "$every"
      # Stop once the job is over: nothing left to disturb.
      local alive=0
      for ((r = 0; r < workers; r++)); do
        kill -0 "${worker_pid[$r]}" 2>/dev/null && alive=1
      done
      ((alive)) || break
      if ((${#kinds[@]} > 0)); then
        if [[ "${kinds[$next]}" == s ]]; then
          victim=$((RANDOM % shards))
        else
          victim=$((shards + RANDOM % workers))
        fi
      else
        victim=$((RANDOM % (shards + workers)))
      fi
      if ((victim < shards)); then
        echo "  t=$((SECONDS - start))s: SIGKILL shard $victim, restart" >&2
        kill -KILL "${shard_pid[$victim]}" 2>/dev/null || true
        wait "${shard_pid[$victim]}" 2>/dev/null || true
        start_shard "$name" "$victim" "${shard_port[$victim]}"
        shard_kills=$((shard_kills + 1))
      else
        r=$((victim - shards))
        kill -0 "${worker_pid[$r]}" 2>/dev/null || continue  # Done already.
        echo "  t=$((SECONDS - start))s: SIGKILL worker $r, restart" >&2
        kill -KILL "${worker_pid[$r]}" 2>/dev/null || true
        wait "${worker_pid[$r]}" 2>/dev/null || true
        start_worker "$name" "$r"
        worker_kills=$((worker_kills + 1))
      fi
      kills=$((kills + 1)) next=$((next + 1))
    done
  fi
  local failed=0
  for ((r = 0; r < workers; r++)); do
    wait "${worker_pid[$r]}" || failed=$((failed + 1))
  done
  local seconds_taken=$((SECONDS - start))
  local acc
  acc=$("$bin/ps_worker" --role=evaluator --servers="$servers" --eval_once \
    2>>"$out/$name/evaluator.log" | sed -n 's/.*accuracy=\([0-9.]*\).*/\1/p')
  for ((s = 0; s < shards; s++)); do
    kill -TERM "${shard_pid[$s]}" 2>/dev/null || true
    wait "${shard_pid[$s]}" 2>/dev/null || true
  done
  result="$name accuracy ${acc:-none} seconds $seconds_taken kills $kills"
  result+=" (shards $shard_kills, workers $worker_kills) failed_workers $failed"
  echo "$result"
}

echo "== mode $mode, $shards shards, $workers workers, $epochs epochs," \
  "slowdown $slowdown, checkpoints $checkpoint_every, seeds" \
  "$first_seed-$last_seed${plan:+, plan $plan}; logs in $out"
kill_seed=$seed
run undisturbed 0
base_acc=$(awk '{print $3}' <<<"$result")
runs=0 total_kills=0 total_shards=0 total_workers=0 total_failed=0 worst=0
for ((kill_seed = first_seed; kill_seed <= last_seed; kill_seed++)); do
  name=chaos
  ((first_seed == last_seed)) || name=chaos-seed$kill_seed
  run "$name" 1
  line=${result//[(),]/}
  read -r _ _ acc _ _ _ k _ ks _ kw _ f <<<"$line"
  runs=$((runs + 1)) total_kills=$((total_kills + k))
  total_shards=$((total_shards + ks)) total_workers=$((total_workers + kw))
  total_failed=$((total_failed + f))
  worst=$(awk -v a="$base_acc" -v b="$acc" -v w="$worst" 'BEGIN {
    d = (b == "none") ? 1 : a - b; if (d < 0) d = -d; print (d > w) ? d : w }')
done
echo "summary mode $mode checkpoints $checkpoint_every runs $runs kills" \
  "$total_kills (shards $total_shards, workers $total_workers) failed_workers" \
  "$total_failed max_accuracy_difference $worst"
