#!/usr/bin/env bash
# The experiment runner on a tiny grid (async and bsp, 2 workers, a few
# steps): it must write its per-run CSVs, the summary, PNG plots and the
# report.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
bin="$TEST_TMPDIR/bin"
out="$TEST_TMPDIR/exp"
mkdir -p "$bin"
cp "$root/server/ps_server" "$root/worker/ps_worker" "$root/tools/psctl" "$bin/"

/usr/bin/python3 "$root/tools/experiment.py" --bin "$bin" --modes async,bsp \
  --workers 2 --profiles none,slow:3 --samples 3000 --eval_every 1s \
  --eval_flags="--max_test_examples=1000" --out "$out"

fail() { echo "FAIL: $*" >&2; exit 1; }
[[ -f "$out/summary.csv" ]] || fail "no summary.csv"
rows=$(($(wc -l <"$out/summary.csv") - 1))
((rows == 4)) || fail "summary.csv has $rows runs, want 4"
for run in async-w2-none-s1 bsp-w2-none-s1 async-w2-slow3-s1 bsp-w2-slow3-s1; do
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
for png in accuracy-time-w2-none accuracy-samples-w2-none staleness-w2-none \
           accuracy-time-w2-slow3 staleness-w2-slow3; do
  f="$out/$png.png"
  [[ -s "$f" ]] || fail "no $f"
  [[ "$(head -c 4 "$f" | tail -c 3)" == "PNG" ]] || fail "$f is not a PNG"
  grep -q "($png.png)" "$out/report.md" || fail "report.md lacks $png"
done
grep -q "| bsp | 2 | slow:3 |" "$out/report.md" || fail "report.md lacks the bsp row"
echo "PASS"
