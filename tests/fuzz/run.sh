#!/usr/bin/env bash
# Builds the libFuzzer targets (--config=fuzz: clang, ASAN+UBSAN) and runs
# each: first over its seed corpus (tests/fuzz/corpus/<target>/; every file
# there is a regression case, crashes found before included), then for
# --seconds on new inputs mutated from a copy of it. Prints one line per
# target, "//tests/fuzz:<target>_fuzzer PASSED|FAILED ...". A crash's input
# is left in --out; add it to the corpus once fixed.
#   tests/fuzz/run.sh [--seconds N] [--out DIR]     (tests/run_tests.sh: 15 s each)
set -uo pipefail
cd "$(dirname "$0")/../.."
seconds=60
out=/tmp/asyncps-fuzz
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "run.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
targets=(request checkpoint idx)
bazel build --config=fuzz $(printf ' //tests/fuzz:%s_fuzzer' "${targets[@]}") \
  >"$out/build.log" 2>&1
bin=$(bazel info --config=fuzz bazel-bin 2>/dev/null)/tests/fuzz
# One target: the seeds, each once; then new inputs for $seconds. Prints
# its line; returns non-zero if it failed.
fuzz() {
  local t=$1 f="$bin/${1}_fuzzer" work="$out/$1-corpus" log="$out/$1.log"
  if [[ ! -x "$f" ]]; then
    echo "//tests/fuzz:${t}_fuzzer FAILED TO BUILD"
    cat "$out/build.log"
    return 1
  fi
  rm -rf "$work"
  cp -r "tests/fuzz/corpus/$t" "$work"
  if "$f" -runs=0 "tests/fuzz/corpus/$t" >"$log" 2>&1 &&
    "$f" "$work" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -malloc_limit_mb=2048 -artifact_prefix="$out/$t-" -print_final_stats=1 \
      >>"$log" 2>&1; then
    runs=$(grep -o "stat::number_of_executed_units: *[0-9]*" "$log" | tail -1 | grep -o "[0-9]*$")
    cov=$(grep -o "cov: [0-9]*" "$log" | tail -1)
    echo "//tests/fuzz:${t}_fuzzer PASSED (${runs:-?} inputs in ${seconds}s, $cov)"
  else
    echo "//tests/fuzz:${t}_fuzzer FAILED: $(grep -m1 -E "ERROR: (libFuzzer|AddressSanitizer|UndefinedBehavior)|runtime error|SUMMARY" "$log")"
    grep -E "SUMMARY|Test unit written|#[0-9]+ 0x" "$log" | head -n 12
    return 1
  fi
}

# The targets run at once (each libFuzzer process is single-threaded, so
# one at a time would leave a core idle); their lines print in order.
pids=()
for t in "${targets[@]}"; do
  fuzz "$t" >"$out/$t.line" &
  pids+=($!)
done
status=0
for k in "${!targets[@]}"; do
  wait "${pids[$k]}" || status=1
  cat "$out/${targets[$k]}.line"
done
exit $status
