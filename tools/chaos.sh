#!/usr/bin/env bash
# A chaos run (tools/chaos.py says what and how): the same training job
# undisturbed and with random shards and workers SIGKILLed and restarted.
#   tools/chaos.sh [--mode async] [--seeds A-B] [--plan s,w,...] [--bin DIR] ...
exec /usr/bin/python3 "$(dirname "$0")/chaos.py" "$@"
