#!/usr/bin/env bash
# The CNN example (python/examples/fashion_cnn.py) for docs/PYTHON.md: two
# Python workers train it through two ps_server shards, in each mode asked
# for, then the same network under PyTorch DDP (gloo) on the same machine.
# Prints each worker's samples/s and the test accuracy of the result.
#
#   tools/experiments/python_cnn.sh [--epochs 2] [--modes "async bsp"]
#                                   [--out DIR]
#                                   [--args "--lr 0.05 ..."]  (to every worker)
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
epochs=2 modes="async bsp" out="" args=""
while (($#)); do
  case $1 in
    --epochs) epochs=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --args) args=$2; shift 2 ;;
    *) echo "usage: $0 [--epochs N] [--modes \"async bsp\"] [--out DIR] [--args ARGS]" >&2; exit 2 ;;
  esac
done
out=${out:-$(mktemp -d)}
mkdir -p "$out"
deploy/install_deps.sh >/dev/null
bazel build --noshow_progress //server:ps_server //python:asyncps 2>&1 | tail -n 1
bin=$(bazel info bazel-bin 2>/dev/null)
export PYTHONPATH=$bin/python OMP_NUM_THREADS=1
example=python/examples/fashion_cnn.py
pids=()
trap 'kill ${pids[@]+"${pids[@]}"} 2>/dev/null || true; wait 2>/dev/null || true' EXIT

for mode in $modes; do
  echo "== $mode: 2 workers through 2 shards, $epochs epochs"
  pids=()
  mkdir -p "$out/$mode"
  # The shards' launcher prints the servers line once they serve.
  exec {shards_fd}< <(exec python3 python/package/cluster.py \
    --ps_server="$bin/server/ps_server" --shards=2 --mode="$mode" \
    --server_flag=--num_workers=2 --log_dir="$out/$mode")
  pids=($!)
  read -r servers <&"$shards_fd" || exit 1
  workers=()
  for r in 0 1; do
    /usr/bin/python3 "$example" --servers="$servers" --rank=$r --num_workers=2 \
      --mode="$mode" --epochs="$epochs" --log_every=0 $args \
      >"$out/$mode/worker$r.out" 2>&1 &
    workers+=($!)
  done
  for w in "${workers[@]}"; do wait "$w"; done
  cat "$out/$mode"/worker*.out
  /usr/bin/python3 "$example" --servers="$servers" --evaluate
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  exec {shards_fd}<&-
done

echo "== ddp: 2 processes (gloo), $epochs epochs"
port=$((29500 + RANDOM % 1000))
for r in 0 1; do
  /usr/bin/python3 "$example" --ddp --port="$port" --rank=$r --num_workers=2 \
    --epochs="$epochs" --log_every=0 $args >"$out/ddp$r.out" 2>&1 &
  workers[r]=$!
done
wait "${workers[0]}" "${workers[1]}"
cat "$out"/ddp0.out "$out"/ddp1.out
