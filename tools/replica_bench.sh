#!/usr/bin/env bash
# Replicated shards, measured (tools/replica_bench.py says what and how):
# throughput against unreplicated shards, and the pause after a primary's
# SIGKILL.
#   tools/replica_bench.sh [--reps 3] [--kills 10] [--replicas 2] [--bin DIR]
exec /usr/bin/python3 "$(dirname "$0")/replica_bench.py" "$@"
