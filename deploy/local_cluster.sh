#!/usr/bin/env bash
# Brings up an asyncps cluster as plain processes on 127.0.0.1, trains the
# MLP on Fashion-MNIST, shows the test accuracy climbing, and shuts every
# process down at the end or on Ctrl-C.
#
#   deploy/local_cluster.sh [--workers N] [--shards N] [--epochs N]
#                           [--mode async] [--out DIR] [--checkpoint_every D]
#                           [-- ps_worker flags...]
#
# Defaults: 2 shards, 2 workers, 5 epochs, async. --mode (async, ssp, bsp,
# allreduce) goes to the servers and the workers alike. Logs, checkpoints
# (every 30s by default, and at exit; "off" for none) and the evaluator's
# curve (CSV) go to --out (default: a fresh directory under /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."

workers=2
shards=2
epochs=5
mode=async
out=""
extra=()
checkpoint_every=30s
usage() { sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --shards) shards="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --checkpoint_every) checkpoint_every="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "local_cluster.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in workers shards epochs; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "local_cluster.sh: --$v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done
if [[ -z "$out" ]]; then out=$(mktemp -d /tmp/asyncps-cluster.XXXXXX); fi
mkdir -p "$out"

deploy/install_deps.sh
echo "== building"
bazel build --noshow_progress //server:ps_server //worker:ps_worker
bin=$(bazel info bazel-bin 2>/dev/null)
# Private copies, so a rebuild during the run cannot pull them away.
rm -f "$out/ps_server" "$out/ps_worker"
cp "$bin/server/ps_server" "$bin/worker/ps_worker" "$out/"
bazel shutdown

pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'echo; echo "== interrupted: stopping the cluster"; exit 130' INT TERM

echo "== starting $shards shards"
source deploy/shards.sh
ckpt=()
if [[ "$checkpoint_every" != off ]]; then
  mkdir -p "$out/checkpoints"
  ckpt=(--checkpoint_dir="$out/checkpoints" --checkpoint_every="$checkpoint_every")
  echo "   checkpoints every $checkpoint_every in $out/checkpoints"
fi
start_shards "$out" "$out" "$shards" --mode="$mode" ${ckpt[@]+"${ckpt[@]}"} || exit 1
echo "   servers: $servers"

echo "== starting the evaluator and $workers workers (mode $mode, $epochs epochs)"
"$out/ps_worker" --role=evaluator --servers="$servers" --eval_every=10s \
  --curve="$out/curve.csv" 2>"$out/evaluator.log" | sed -u 's/^/[eval] /' &
eval_pid=$!
pids+=($eval_pid)
worker_pids=()
for ((r = 0; r < workers; r++)); do
  "$out/ps_worker" --servers="$servers" --rank=$r --num_workers="$workers" \
    --mode="$mode" --epochs="$epochs" --log_every=10s ${extra[@]+"${extra[@]}"} \
    2>"$out/worker$r.log" | sed -u "s/^/[worker $r] /" &
  worker_pids+=($!)
  pids+=($!)
done

start=$(date +%s)
status=0
for p in "${worker_pids[@]}"; do wait "$p" || status=1; done
if ((status != 0)); then
  echo "== a worker failed; its log is in $out" >&2
  tail -n 3 "$out"/worker*.log >&2
fi
echo "== training took $(($(date +%s) - start)) s; final evaluation"
# The evaluator scores once more on SIGTERM, then exits.
pkill -TERM -f "^$out/ps_worker --role=evaluator" || true
wait "$eval_pid" || true
echo "== curve: $out/curve.csv"
tail -n 1 "$out/curve.csv" | awk -F, '{printf "== final test accuracy %.4f after %.0f updates\n", $4, $2}'
exit $status
