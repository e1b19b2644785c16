#!/usr/bin/env bash
# Chaos as a test (issue #21): one mode's job trained undisturbed, then
# with four shard kills (each restarted from its checkpoint) and two worker
# kills (each restarted with the same rank), in a fixed order with fixed
# seeds. Every worker must finish (exit 0) and the test accuracy must stay
# within 0.03 of the undisturbed run. Usage (from BUILD): chaos_test.sh MODE
# [REPLICAS]; with REPLICAS each shard is a group of that many processes
# (and a private etcd): the four shard kills hit members, primary or backup,
# which rejoin their group instead of restoring a checkpoint.
set -euo pipefail
mode=$1
state=(--checkpoint_every 1s)
if (($# > 1)); then state=(--replicas "$2"); fi
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
cp "$root/server/ps_server" "$root/worker/ps_worker" "$bin/"
out="$TEST_TMPDIR/chaos"

fail() { echo "FAIL: $*" >&2; exit 1; }
log="$TEST_TMPDIR/chaos.txt"
"$root/tools/reliability/chaos.py" --bin "$bin" --out "$out" --mode "$mode" \
  --epochs 3 --every 1.5 --plan s,w,s,s,w,s "${state[@]}" --seed 3 \
  --seconds 60 | tee "$log"
base=$(awk '$1 == "undisturbed" {print $3}' "$log")
line=$(grep '^chaos ' "$log") || fail "no chaos run reported"
read -r _ _ acc _ _ _ kills _ shard_kills _ worker_kills _ failed _ \
  <<<"${line//[(),]/}"
echo "undisturbed $base, chaos $acc; kills $kills ($shard_kills shards," \
  "$worker_kills workers); workers failed $failed"
if ((failed != 0)); then
  for f in "$out"/chaos/worker*.log; do
    echo "== $f"; grep -v "progress\|loss" "$f" | tail -n 5
  done
  fail "$failed worker(s) did not finish"
fi
((shard_kills >= 4)) || fail "only $shard_kills shard kills (the job ended first)"
((worker_kills >= 2)) || fail "only $worker_kills worker kills (the job ended first)"
awk -v a="$base" -v b="$acc" 'BEGIN {
  d = a - b; if (d < 0) d = -d; exit !(a != "none" && b != "none" && d <= 0.03) }' ||
  fail "accuracy $acc with chaos against $base undisturbed: more than 0.03 apart"
echo "PASS"
