#!/usr/bin/env bash
# Smoke test of tools/bench/wire_bench: each transport and op runs, prints the
# line that says what its ceiling is, then its result line with a positive
# rate (the format tools/bench/bench.py reads). Speed is not checked.
set -euo pipefail
bench="${TEST_SRCDIR}/${TEST_WORKSPACE}/tools/bench/wire_bench"
for transport in tcp grpc; do
  for op in push pull; do
    out=$("$bench" --transport=$transport --op=$op --bytes=65536 \
      --seconds=0.2)
    echo "$out"
    grep -q "^wire_bench ceiling: " <<<"$out" ||
      { echo "FAIL: no ceiling line ($transport $op)"; exit 1; }
    grep -qE "^wire_bench transport=$transport op=$op bytes=65536 rounds_per_s=[0-9.]+ gb_per_s=[0-9.]+$" <<<"$out" ||
      { echo "FAIL: no result line ($transport $op)"; exit 1; }
    grep -qE "gb_per_s=0\.000$" <<<"$out" &&
      { echo "FAIL: no payload moved ($transport $op)"; exit 1; }
  done
done
# The grpc ceiling says it is the default-options synchronous client.
"$bench" --transport=grpc --seconds=0.1 --bytes=1024 |
  grep -q "synchronous.*default options except max send/receive message size"
# Tuning flags are named on the ceiling line, never silent.
"$bench" --transport=grpc --seconds=0.1 --bytes=1024 --frame=65536 |
  grep -q "TUNED max_frame_size=65536"
# A bad flag is refused.
if "$bench" --transport=udp 2>/dev/null; then
  echo "FAIL: --transport=udp accepted"; exit 1
fi
echo PASS
