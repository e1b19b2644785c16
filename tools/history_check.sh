#!/usr/bin/env bash
# Moved to tools/reliability/history_check.py; this path stays for the
# commands written before the move (dated records, commit messages).
exec "$(dirname "$0")/reliability/history_check.py" "$@"
