#!/usr/bin/env bash
# `pip install ./python` in a fresh virtual environment that sees Debian's
# packages (torch, numpy), then what README.md promises of it: the version,
# ps_server / psctl / asyncps-run on PATH, and README's example trained
# through two shards started from PATH. Run by tests/run_tests.sh; prints
# "//:pip_install PASSED" or "... FAILED".
set -uo pipefail
cd "$(dirname "$0")/.."
dir=$(mktemp -d /tmp/asyncps-pip.XXXXXX)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() { echo "pip_install: $*" >&2; echo "//:pip_install FAILED"; exit 1; }

/usr/bin/python3 -m venv --system-site-packages "$dir/venv" || fail "no venv"
# Offline: nothing to download (the build runs Bazel on Debian's packages).
"$dir/venv/bin/pip" install --quiet --no-index ./python >"$dir/pip.log" 2>&1 ||
  { tail -n 20 "$dir/pip.log" >&2; fail "pip install ./python failed"; }
export PATH="$dir/venv/bin:$PATH"
cd "$dir"  # Away from the source tree: the installed package is used.
version=$(python -c 'import asyncps; print(asyncps.__version__)') ||
  fail "import asyncps"
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "version '$version'"
for b in ps_server psctl asyncps-run; do
  [[ "$(command -v $b)" == "$dir/venv/bin/$b" ]] || fail "$b not on PATH"
done
python -c 'import asyncps, os; assert os.path.exists(os.path.join(os.path.dirname(asyncps.__file__), "_core.pyi"))' ||
  fail "no type stubs"
servers=""
for s in 0 1; do
  ps_server --host=127.0.0.1 --port=0 --shard=$s --num_shards=2 \
    >"$dir/s$s.out" 2>"$dir/s$s.log" &
  pids+=($!)
  line=$(timeout 30 tail -n +1 -f "$dir/s$s.out" | grep -m1 "listening on" ||
    true)
  [[ -n "$line" ]] || fail "shard $s did not start"
  servers+="${servers:+,}127.0.0.1:${line##*:}"
done
out=$(python "$OLDPWD/python/examples/minimal.py" "$servers") ||
  fail "README's example failed"
acc=$(sed -n 's/.*accuracy \([0-9.]*\).*/\1/p' <<<"$out")
awk -v a="$acc" 'BEGIN {exit !(a >= 0.95)}' || fail "example: $out"
psctl --servers="$servers" export --out="$dir/m.npz" >/dev/null ||
  fail "psctl export"
echo "pip_install: asyncps $version installed; example: $out"
echo "//:pip_install PASSED"
