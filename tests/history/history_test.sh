#!/usr/bin/env bash
# The history checker (tools/reliability/history_check.py) over short fixed
# seeds: unreplicated async, bsp with rows and ssp with rows (shard restarts
# from checkpoints, worker kills mid-push, dropped connections), then replicated
# bsp with rows (the tables replicated too) and async (primary and backup
# kills, a primary stopped past its lease), then elastic bsp and ssp with
# rows (workers of ranks 2 and 3 joining and SIGTERMed while the job
# trains, beside the other faults). Fails on any departure from the model (no kind is --known).
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
mkdir -p "$bin"
cp "$root/server/ps_server" "$root/tools/psctl" "$bin/"
export PYTHONPATH="$root/python"
export OMP_NUM_THREADS=1
out="$TEST_TMPDIR/history"
check="$root/tools/reliability/history_check.py"
"$check" --bin "$bin" --out "$out/a" --seconds 4 \
  --every 1.2 --seeds 1-2 --combos async,bsp/rows,ssp/rows
"$check" --bin "$bin" --out "$out/b" --seconds 5 \
  --every 1.2 --seeds 1-1 --combos bsp/rows/r2,async/r2
"$check" --bin "$bin" --out "$out/c" --seconds 5 \
  --every 1.0 --seeds 1-1 --combos bsp/elastic,ssp/rows/elastic
echo PASS
