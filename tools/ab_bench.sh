#!/usr/bin/env bash
# Moved to tools/bench/ab_bench.sh; this path stays for the commands written
# before the move (dated records, commit messages).
exec "$(dirname "$0")/bench/ab_bench.sh" "$@"
