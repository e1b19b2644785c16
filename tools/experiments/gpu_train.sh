#!/usr/bin/env bash
# Trains the MLP 784-256-128-10 on Fashion-MNIST through two local shards,
# with every worker on one device, then scores the servers' weights on the
# test set: the end-to-end check that a worker on a GPU trains like one on
# the CPU (same seed, same data, same servers).
#
#   tools/experiments/gpu_train.sh [--device=cuda:0] [--workers=2]
#                                  [ps_worker flags...]
#
# Prints each worker's "rank R done:" line and the evaluator's line.
# BIN (default: a build into bazel-bin, --config=cuda where nvcc is
# installed) names a folder holding ps_server and ps_worker; DATA the
# folder with the IDX files (default: ps_worker's).
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/ops/gpu_binaries.sh
gpu_binaries gpu_train //server:ps_server //worker:ps_worker
workers=2
args=()
for a in "$@"; do
  case "$a" in
    --workers=*) workers="${a#--workers=}" ;;
    *) args+=("$a") ;;
  esac
done
if [[ -n "${DATA:-}" ]]; then args+=("--data_dir=$DATA"); fi
export BIN workers
# The job runs under the launcher, which sets $ASYNCPS_SERVERS and stops
# the shards when the job's shell exits.
python3 python/package/cluster.py --ps_server="$BIN/ps_server" --shards=2 -- \
  bash -c '
    set -uo pipefail
    pids=()
    for ((r = 0; r < workers; r++)); do
      "$BIN/ps_worker" --servers="$ASYNCPS_SERVERS" --rank=$r \
        --num_workers=$workers --log_every=1h "$@" 2>&1 |
        grep -E "done:|failed|refus|rror" &
      pids+=($!)
    done
    status=0
    for p in "${pids[@]}"; do wait "$p" || status=1; done
    if ((status != 0)); then exit 1; fi
    data=()
    for a in "$@"; do
      case "$a" in --data_dir=*) data+=("$a") ;; esac
    done
    "$BIN/ps_worker" --role=evaluator --servers="$ASYNCPS_SERVERS" \
      --eval_once --device=cpu ${data[@]+"${data[@]}"} 2>/dev/null
  ' job ${args[@]+"${args[@]}"} | tail -n +2
exit "${PIPESTATUS[0]}"
