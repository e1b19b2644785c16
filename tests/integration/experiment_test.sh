#!/usr/bin/env bash
# The experiment runner on a tiny grid (async with bf16 on the wire and bsp,
# 2 workers, 2 seeds, a few steps): it must write its per-run CSVs, the
# summary, the seed bands, PNG plots and the report with a mean-and-spread
# table.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
out="$TEST_TMPDIR/exp"
mkdir -p "$bin"
cp "$root/server/ps_server" "$root/worker/ps_worker" "$root/tools/psctl" "$bin/"

/usr/bin/python3 "$root/tools/experiments/experiment.py" --bin "$bin" \
  --modes async+bf16,bsp --workers 2 --profiles none --seeds 1,2 \
  --samples 3000 --eval_every 1s --eval_flags="--max_test_examples=1000" \
  --out "$out"

fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -f "$out/summary.csv" ]] || fail "no summary.csv"
rows=$(($(wc -l <"$out/summary.csv") - 1))
((rows == 4)) || fail "summary.csv has $rows runs, want 4"
for run in async_bf16-w2-none-s1 bsp-w2-none-s1 async_bf16-w2-none-s2 bsp-w2-none-s2; do
  csv="$out/runs/$run.csv"
  [[ -f "$csv" ]] || fail "no $csv"
  head -1 "$csv" | grep -q "^seconds,updates,samples,test_loss,test_accuracy" ||
    fail "$csv has the wrong header"
  (($(wc -l <"$csv") >= 2)) || fail "$csv has no rows"
  # Accuracies are numbers in [0, 1].
  awk -F, 'NR > 1 && ($5 < 0 || $5 > 1) {exit 1}' "$csv" || fail "$csv: bad accuracy"
done
# The bsp runs apply every gradient at staleness 0.
grep -q '^0,[1-9]' "$out/runs/bsp-w2-none-s1.hist.csv" || fail "bsp histogram"
# The bf16 variant reached the workers.
grep -q "wire bf16, exchange fused" "$out/runs/async_bf16-w2-none-s1.log" ||
  fail "the async+bf16 run's workers did not use bf16"
grep -q "wire f32, exchange layered" "$out/runs/bsp-w2-none-s1.log" ||
  fail "the bsp run's workers did not use f32, layered"
# Seed bands: x, mean, min, max with min <= mean <= max.
band="$out/runs/band-samples-w2-none-bsp.dat"
[[ -s "$band" ]] || fail "no $band"
awk 'NF != 4 || $3 > $2 + 1e-9 || $2 > $4 + 1e-9 {exit 1}' "$band" ||
  fail "$band is not x mean min max"
for png in accuracy-time-w2-none accuracy-samples-w2-none staleness-w2-none; do
  f="$out/$png.png"
  [[ -s "$f" ]] || fail "no $f"
  [[ "$(head -c 4 "$f" | tail -c 3)" == "PNG" ]] || fail "$f is not a PNG"
  grep -q "($png.png)" "$out/report.md" || fail "report.md lacks $png"
done
grep -q "| bsp | 2 | none | 2 | 0\.[0-9]* ± " "$out/report.md" ||
  fail "report.md lacks the bsp row over 2 seeds"
echo "PASS"
