#!/usr/bin/env bash
# Starts the Docker engine (Debian's docker.io) in the background when it is
# not running, and waits (at most 60 s) until it answers. Prints the pid of
# the dockerd it started, or nothing if one was already running, so a caller
# that started it can stop it again.
#   pid=$(deploy/docker/ensure_dockerd.sh)
set -euo pipefail
# dockerd and debootstrap live in sbin, which a test's PATH leaves out.
export PATH="$PATH:/usr/sbin:/sbin"
if docker info >/dev/null 2>&1; then exit 0; fi
if ! command -v dockerd >/dev/null; then
  echo "ensure_dockerd.sh: no dockerd (apt-get install docker.io)" >&2
  exit 1
fi
log=/tmp/asyncps-dockerd.log
setsid dockerd >"$log" 2>&1 </dev/null &
pid=$!
for _ in $(seq 600); do
  if docker info >/dev/null 2>&1; then
    echo "$pid"
    exit 0
  fi
  if ! kill -0 "$pid" 2>/dev/null; then break; fi
  sleep 0.1
done
echo "ensure_dockerd.sh: dockerd did not come up; see $log:" >&2
tail -n 5 "$log" >&2
exit 1
