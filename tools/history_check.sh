#!/usr/bin/env bash
# The history checker (tools/history_check.py says what and how): pushes
# journaled with their answers, faults injected, the final state compared
# with the model of the promises.
#   tools/history_check.sh [--bin DIR] [--out DIR] [--seconds S] [--every S]
#                          [--seeds A-B | --seeds N] [--minutes M]
#                          [--combos LIST|all] [--known NAMES]
exec /usr/bin/python3 "$(dirname "$0")/history_check.py" "$@"
