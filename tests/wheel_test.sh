#!/usr/bin/env bash
# `pip wheel ./python`, then the wheel installed where there is no compiler
# and no Bazel: a container from the project's Debian 12 base image with
# Python, numpy and the runtime libraries setup.py names (apt), checked to
# hold no cc, gcc, g++, c++, clang or bazel. There the wheel installs
# offline into a virtual environment, puts ps_server, psctl and asyncps-run
# on PATH, and trains a small job: asyncps-run starts a shard and two
# workers fitting a linear model with asyncps.Client, on loopback only
# (--network none). Run by tests/run_tests.sh; prints "//:wheel PASSED"
# or "... FAILED". The container and its image are removed at the end.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
fail() { echo "wheel: $*" >&2; echo "//:wheel FAILED"; exit 1; }
# The compose tests' lock: one of them may have started dockerd and would
# stop it at its end.
exec 9>/tmp/asyncps-compose.lock
flock 9
dir=$(mktemp -d /tmp/asyncps-wheel.XXXXXX)
image="asyncps/wheel-test:$$"
started_dockerd=""
cleanup() {
  docker rmi -f "$image" >/dev/null 2>&1 || true
  if [[ -n "$started_dockerd" ]]; then kill "$started_dockerd" 2>/dev/null || true; fi
  rm -rf "$dir"
}
trap cleanup EXIT

/usr/bin/python3 -m pip wheel --quiet --no-deps --no-index --no-build-isolation \
  -w "$dir/context" ./python >"$dir/pip.log" 2>&1 ||
  { tail -n 20 "$dir/pip.log" >&2; fail "pip wheel ./python failed"; }
wheel=$(cd "$dir/context" && ls asyncps-*.whl)
[[ "$wheel" =~ ^asyncps-[0-9.]+-cp311-cp311-linux_x86_64\.whl$ ]] ||
  fail "the wheel is '$wheel', not tagged cp311-cp311-linux_x86_64"
# The listing read whole first: unzip writes it line by line, and grep -q
# leaving at its match made unzip die of SIGPIPE, which pipefail took for a
# missing file (2 checks in 1200 failed so).
listing=$(unzip -l "$dir/context/$wheel") || fail "unzip -l $wheel failed"
for f in asyncps/_core.so asyncps/bin/ps_server asyncps/bin/psctl asyncps/run.py; do
  grep -q " $f\$" <<<"$listing" || fail "$wheel lacks $f"
done

started_dockerd=$(deploy/docker/ensure_dockerd.sh) || fail "no Docker engine"
deploy/docker/base_image.sh >/dev/null || fail "the base image"
cat >"$dir/context/job.py" <<'PY'
# Two workers fit w in y = x.w (w = 1..4) through one shard, asynchronously.
import numpy as np
import asyncps
client = asyncps.Client()
truth = np.arange(1, 5, dtype=np.float32)
rng = np.random.default_rng(client.rank)
client.declare({"w": np.zeros(4, np.float32)}, optimizer="sgd", lr=0.05)
w = client.pull(["w"])["w"]
for step in range(300):
    x = rng.normal(size=(16, 4)).astype(np.float32)
    grad = 2 * x.T @ (x @ w - x @ truth) / len(x)
    w = client.push_pull({"w": grad})["w"]
print(f"rank {client.rank} error {float(np.abs(w - truth).max()):.4f}", flush=True)
client.leave()
PY
cat >"$dir/context/Dockerfile" <<EOF2
FROM asyncps/debian:12
RUN apt-get update \\
 && apt-get install -y --no-install-recommends python3 python3-venv \\
      python3-numpy libgrpc++1.51 libprotobuf32 libabsl20220623 \\
      libgoogle-glog0v6 libprometheus-cpp-core1.0 libcpp-httplib0.11 \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb
RUN for c in cc gcc g++ c++ clang bazel; do \\
      if command -v \$c; then echo "\$c is installed" >&2; exit 1; fi; done
COPY $wheel job.py /tmp/
RUN python3 -m venv --system-site-packages /opt/asyncps \\
 && /opt/asyncps/bin/pip install --quiet --no-index /tmp/$wheel
ENV PATH=/opt/asyncps/bin:\$PATH
EOF2
docker build -q -t "$image" "$dir/context" >"$dir/build.log" 2>&1 ||
  { tail -n 20 "$dir/build.log" >&2; fail "the image with the wheel did not build"; }
out=$(timeout 300 docker run --rm --network none "$image" sh -c '
  command -v ps_server psctl asyncps-run >/dev/null || exit 3
  cd /tmp && asyncps-run --shards 1 --workers 2 -- job.py' 2>&1) ||
  { echo "$out" | tail -n 20 >&2; fail "the job in the container failed"; }
errors=$(sed -n 's/^rank [01] error \([0-9.]*\)$/\1/p' <<<"$out")
[[ $(wc -l <<<"$errors") == 2 ]] || fail "the workers said: $out"
for e in $errors; do
  awk -v e="$e" 'BEGIN {exit !(e < 0.01)}' || fail "not trained: $out"
done
echo "wheel: $wheel installed without a compiler; $(tr '\n' ' ' <<<"$out")"
echo "//:wheel PASSED"
