#!/usr/bin/env bash
# Every speed figure of asyncps against its ceiling, measured in one run on
# an otherwise idle machine (docs/BENCHMARKS.md shows a run). This script
# installs what is missing and builds; tools/bench/bench.py measures:
#   1. ceilings: raw TCP over loopback and the plain synchronous gRPC client
#      ("naive gRPC", tools/bench/wire_bench), push and pull, at 64 KiB, 1 MiB
# and
#      16 MiB;
#   2. ps_bench through real shards: pull, push, the fused pushpull and
#      pull+push, 1 and 2 shards, 1 and 2 client threads, over the data
#      plane (--transport=tcp, the default), and pushpull over gRPC beside it;
#   3. training samples/s of the MLP 784-256-128-10, batch 64 per worker:
#      compute alone, the worker loop with no communication (allreduce, one
#      worker), async with 1 and 2 workers (each --exchange, f32 and bf16;
#      fused f32 over gRPC beside the data plane),
#      bsp and allreduce with 2 workers, and PyTorch (Debian's python3-torch,
#      installed here if missing) in one process and DDP with 2;
#   4. the server's per-byte work (tools/bench/micro_bench, Google Benchmark):
#      each optimizer's apply and the payload codecs, against a memory
#      bandwidth ceiling (a 64 MiB memcpy) measured in the same binary.
# Every line ends with its ratio to the ceiling it is compared with.
#
#   tools/bench/bench.sh [--quick]     # --quick: 1 MiB only, shorter runs
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -uo pipefail
cd "$(dirname "$0")/../.."
quick=0
[[ "${1:-}" == "--quick" ]] && quick=1
deploy/install_deps.sh
if ! /usr/bin/python3 -c "import torch" 2>/dev/null; then
  echo "bench: installing python3-torch for the PyTorch rows" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
    python3-torch >/dev/null || echo "bench: no python3-torch; PyTorch rows skipped" >&2
fi
bazel build //server:ps_server //worker:ps_worker //tools/bench:ps_bench \
  //tools/bench:wire_bench //tools/bench:gpu_bench //tools/bench:micro_bench \
  >/dev/null 2>&1 || { echo "build failed"; exit 1; }
bin=$(mktemp -d /tmp/bench.XXXXXX)
cp bazel-bin/server/ps_server bazel-bin/worker/ps_worker "$bin/"
cp bazel-bin/tools/bench/{ps_bench,wire_bench,gpu_bench,micro_bench} "$bin/"
bazel shutdown >/dev/null 2>&1
trap 'rm -rf "$bin"' EXIT
flags=()
((quick)) && flags=(--quick)
/usr/bin/python3 tools/bench/bench.py --bin "$bin" "${flags[@]}"
