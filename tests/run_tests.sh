#!/usr/bin/env bash
# Installs what asyncps needs, builds everything, runs every test, and ends
# with one line "N passed, N failed". Exit status 0 only if all passed.
#
#   tests/run_tests.sh            # the whole suite
#   tests/run_tests.sh //common/...   # a subset (any bazel target patterns)
set -uo pipefail
cd "$(dirname "$0")/.."

deploy/install_deps.sh || { echo "0 passed, 1 failed"; exit 1; }

targets=("$@")
if ((${#targets[@]} == 0)); then targets=(//...); fi

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Each phase's wall time, for keeping the suite within its budget.
mark=0  # The first phase includes the installs.
took() {
  echo "== $1 took $((SECONDS - mark)) s (suite so far: ${SECONDS} s)"
  mark=$SECONDS
}
bazel test --test_tag_filters=-benchmark,-gpu "${targets[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
took "install and tests"

# Runs `bazel test` with the given flags and targets under a sanitizer
# ($1 names it, $2 says it in words) and adds one line for the whole run to
# the log (//:$1), so the totals count each test once; failures by name.
sanitized() {
  local name=$1 words=$2
  shift 2
  local out status passed
  out=$(mktemp)
  bazel test --test_tag_filters=-benchmark,-gpu "$@" >"$out" 2>&1
  status=$?
  grep -E '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS)' "$out" |
    sed "s|^\(//[^ ]*\)|\1 ($name)|"
  passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$out")
  if ((status != 0)); then
    rc=1
    tail -n 30 "$out"
    echo "//:$name FAILED ($passed tests passed under $words)" | tee -a "$log"
  else
    echo "//:$name PASSED ($passed tests under $words)" | tee -a "$log"
  fi
  rm -f "$out"
}

# AddressSanitizer + UndefinedBehaviorSanitizer over the unit tests and the
# in-process integration tests (those that start no process of their own
# but etcd),
# built by Debian's clang with -Wthread-safety -Werror (--config=asan), so
# the same build checks every ABSL_GUARDED_BY / ABSL_EXCLUSIVE_LOCKS_REQUIRED
# claim: the libraries and binaries that hold them are built with the tests
# (tools/ holds none of its own and is left out to save the time).
if ((${#@} == 0)); then
  echo "== clang: AddressSanitizer + UndefinedBehaviorSanitizer, thread-safety analysis (--config=asan)"
  asan_tests=(//tests/common/... //tests/server/... //tests/worker/...
    //tests/client/... //tests/transport/...)
  for t in checkpoint data_plane data_plane_hostile declare embedding \
    exactly_once ps_exchange ps_exchange_bsp push_pull validation \
    shard_answers replica; do
    asan_tests+=("//tests/integration:${t}_test")
  done
  sanitized asan "clang ASAN+UBSAN, -Wthread-safety -Werror" --config=asan \
    "${asan_tests[@]}" //common/... //rpc/... //server/... //client/... \
    //worker/... //transport/...
  took "ASAN and thread-safety"
fi

# ThreadSanitizer over the server's concurrent core (store, consistency,
# membership, key-value store, checkpoints: every test of tests/server but
# the one through gRPC, whose Debian build TSAN cannot see into), with
# Debian's Abseil rebuilt for it (tests/tsan/abseil.sh says why) and its
# canary first.
if ((${#@} == 0)); then
  echo "== ThreadSanitizer (--config=tsan)"
  if absl_tsan=$(tests/tsan/abseil.sh | tail -n 1); then
    tsan_options=halt_on_error=1:second_deadlock_stack=1
    tsan_options+=:suppressions=$PWD/tests/tsan/suppressions.txt
    tsan_tests=(//tests/tsan:mutex_canary_test)
    for t in checkpoint concurrency consistency consistency_restart \
      embedding_table kv_store membership recovery_rules shard_store \
      replication replication_pipeline replication_join; do
      tsan_tests+=("//tests/server:${t}_test")
    done
    sanitized tsan TSAN --config=tsan --test_env=LD_LIBRARY_PATH="$absl_tsan" \
      --test_env=TSAN_OPTIONS="$tsan_options" "${tsan_tests[@]}"
  else
    rc=1
    echo "//:tsan FAILED TO BUILD (tests/tsan/abseil.sh)" | tee -a "$log"
  fi
  took "TSAN"
fi

# libFuzzer targets (clang, ASAN+UBSAN): each over its seed corpus, then
# 15 s of new inputs (tests/fuzz/run.sh runs longer by hand).
if ((${#@} == 0)); then
  echo "== fuzzing (tests/fuzz/run.sh --seconds 15)"
  tests/fuzz/run.sh --seconds 15 | tee -a "$log"
  if ((PIPESTATUS[0] != 0)); then rc=1; fi
  took "fuzzing"
fi

# The CUDA configuration builds wherever the toolkit is installed, GPU or
# not; its tests skip, saying so, on a machine without a GPU.
if ((${#@} == 0)) && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  echo "== CUDA configuration (--config=cuda)"
  bazel test --config=cuda //tests/worker:cuda_backend_test 2>&1 | tee -a "$log"
  cuda_rc=${PIPESTATUS[0]}
  if grep -q "CUDA tests skipped" bazel-testlogs/tests/worker/cuda_backend_test/test.log 2>/dev/null; then
    echo "== note: cuda_backend_test passed by skipping: this machine has no GPU"
  fi
  bazel build --config=cuda //worker:ps_worker //tools/bench:gpu_bench 2>&1 |
    tail -n 3
  cuda_build_rc=${PIPESTATUS[0]}
  if ((cuda_rc != 0 || cuda_build_rc != 0)); then rc=1; fi
  if ((cuda_build_rc != 0)); then echo "//:cuda_build FAILED TO BUILD" >>"$log"; fi
  took "CUDA configuration"
fi

# pip install ./python in a fresh virtual environment, then README's example
# through the installed package and binaries (tests/pip_install.sh).
if ((${#@} == 0)); then
  echo "== pip install ./python"
  tests/pip_install.sh | tee -a "$log"
  if ((PIPESTATUS[0] != 0)); then rc=1; fi
  took "pip install"
  # pip wheel ./python, installed and trained with in a container that has
  # no compiler and no Bazel (tests/wheel_test.sh).
  echo "== pip wheel ./python, in a container without a compiler"
  tests/wheel_test.sh | tee -a "$log"
  if ((PIPESTATUS[0] != 0)); then rc=1; fi
  took "wheel"
fi

# Bazel prints one status line per test target:
#   //pkg:name   PASSED in 0.3s / FAILED in 1.2s / FAILED TO BUILD / TIMEOUT ...
passed=$(grep -cE '^//[^ ]+ +(\(cached\) )?PASSED' "$log")
failed=$(grep -cE '^//[^ ]+ +(\(cached\) )?(FAILED|TIMEOUT|NO STATUS|INCOMPLETE|FLAKY)' "$log")
if ((rc != 0 && failed == 0)); then
  failed=1  # The build itself broke before any test ran.
fi
bazel shutdown >/dev/null 2>&1 || true
echo "${passed} passed, ${failed} failed"
((rc == 0 && failed == 0))
