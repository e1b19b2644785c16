#!/usr/bin/env bash
# README.md's quickstart ("Running the pieces by hand", the block after the
# `<!-- quickstart` marker), run as it is, command by command (bash -x
# shows each): in a network namespace of its own, so that its fixed ports
# (5000, 5001) are free and nothing it starts outlives it. `bazel build`
# there is the build this test already depends on: bazel-bin/ holds the
# binaries Bazel built for it. Then: every command exited 0, the evaluator
# scored the trained model, and psctl doctor found no problem.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip
root=$PWD
fail() { echo "FAIL: $*"; exit 1; }

if ! unshare --net true 2>/dev/null; then
  echo "SKIPPED: cannot create a network namespace here (root needed)"; exit 0
fi
block=$(awk '/<!-- quickstart/ {on = 1; next}
             on && /^```sh/ {inside = 1; next}
             inside && /^```/ {exit}
             inside {print}' "$root/README.md")
[[ -n "$block" ]] || fail "README.md has no quickstart block"
grep -q '^bazel build ' <<<"$block" || fail "the quickstart does not build"

work=${TEST_TMPDIR:-$(mktemp -d)}/quickstart
mkdir -p "$work/bazel-bin/server" "$work/bazel-bin/worker" "$work/bazel-bin/tools"
ln -sf "$root/server/ps_server" "$work/bazel-bin/server/ps_server"
ln -sf "$root/worker/ps_worker" "$work/bazel-bin/worker/ps_worker"
ln -sf "$root/tools/psctl" "$work/bazel-bin/tools/psctl"
cat >"$work/quickstart.sh" <<SCRIPT
set -euxo pipefail
ip link set lo up
cd "$work"
# The targets the README builds are this test's data: built already.
bazel() {
  [[ "\$1" == build ]] || { echo "the quickstart runs bazel \$*" >&2; return 1; }
}
$block
SCRIPT
# --kill-child: whatever the script left running dies with it.
out=$(timeout 300 unshare --net --fork --kill-child bash "$work/quickstart.sh" 2>&1)
status=$?
echo "$out" | grep -v '^I[0-9]\{4\}' | tail -40
((status == 0)) || fail "the quickstart exited $status"
grep -q "no problem found" <<<"$out" || fail "psctl doctor found a problem"
python3 - "$work/curve.csv" <<'PY' || fail "the evaluator's curve"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
accuracy = float(rows[-1]["test_accuracy"])
assert accuracy > 0.7, f"final accuracy {accuracy}"
print(f"final accuracy {accuracy:.4f} after {len(rows)} scores")
PY
echo "PASS"
