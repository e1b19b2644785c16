#!/usr/bin/env bash
# Emulated hosts with real links (issue #26; docs/COMPRESSION.md "Emulated
# links"): N network namespaces ("hosts") on one switch, each host's link
# shaped on its way out with tc's tbf, then a command, then everything
# removed.
#
#   deploy/netem_cluster.sh [--hosts N] [--link RATE] [--name NAME] -- CMD...
#   deploy/netem_cluster.sh --up [--hosts N] [--link RATE] --name NAME
#   deploy/netem_cluster.sh --down NAME    # --up's hosts, or what an
#                                          # interrupted run left
#
# Host i is the namespace NAME-h<i> with address 198.18.0.<i+1>/24 (the
# benchmarking range, used inside these namespaces only) on its interface
# e0, a veth pair to the bridge in NAME-sw (a bridge of its own namespace:
# the host's firewall, e.g. docker's, does not see its traffic). RATE is
# tc's (1gbit, 100mbit; default 1gbit), applied to each host's egress, so
# every link is RATE each way. The kernel here has tbf but not netem:
# bandwidth is emulated, latency is not.
#
# CMD runs in this (the root) namespace with NETEM_NAME, NETEM_RATE,
# NETEM_HOSTS (the namespaces, space-separated) and NETEM_ADDRS (their
# addresses) set; it reaches a host with `ip netns exec NAME-h<i> ...`.
# Afterwards (also on SIGINT/SIGTERM, or if setting up fails) every process
# left in the namespaces is killed and the namespaces are deleted, which
# removes their links. The exit status is CMD's.
set -euo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip, tc

hosts=3
rate=1gbit
name="netem$$"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --hosts) hosts=$2; shift 2 ;;
    --link) rate=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --down) name=$2; down_only=1; shift 2 ;;
    --up) up_only=1; shift ;;
    --) shift; break ;;
    *) echo "netem_cluster.sh: unknown argument '$1' (see the script's header)" >&2; exit 2 ;;
  esac
done
if ! [[ "$name" =~ ^[A-Za-z0-9_]{1,10}$ ]]; then
  echo "netem_cluster.sh: --name '$name' must be 1-10 of [A-Za-z0-9_]" >&2
  exit 2
fi

# Kills what runs in each of NAME's namespaces, then deletes them.
down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^${name}-(sw|h[0-9]+)$" || true); do
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
}

if [[ -n "${down_only:-}" ]]; then
  down
  exit 0
fi
if ! [[ "$hosts" =~ ^[0-9]+$ ]] || ((hosts < 1 || hosts > 200)); then
  echo "netem_cluster.sh: --hosts $hosts is not in [1, 200]" >&2
  exit 2
fi
if [[ $# -eq 0 && -z "${up_only:-}" ]]; then
  echo "netem_cluster.sh: no command after --" >&2
  exit 2
fi

child=""
# The command runs in the background so that a signal reaches this shell
# while it waits (bash runs traps only between foreground commands).
stop() {
  if [[ -n "$child" ]]; then kill -TERM "$child" 2>/dev/null || true; wait "$child" 2>/dev/null || true; fi
  exit "$1"
}
trap down EXIT
trap 'stop 130' INT
trap 'stop 143' TERM

sw="$name-sw"
ip netns add "$sw"
ip -n "$sw" link add br0 type bridge
ip -n "$sw" link set br0 up
ip -n "$sw" link set lo up
NETEM_HOSTS=""
NETEM_ADDRS=""
for ((i = 0; i < hosts; i++)); do
  ns="$name-h$i"
  addr="198.18.0.$((i + 1))"
  ip netns add "$ns"
  ip -n "$sw" link add "v$i" type veth peer name e0 netns "$ns"
  ip -n "$sw" link set "v$i" master br0
  ip -n "$sw" link set "v$i" up
  ip -n "$ns" link set lo up
  ip -n "$ns" addr add "$addr/24" dev e0
  ip -n "$ns" link set e0 up
  # A burst of a few packets' worth per millisecond at the rate keeps tbf
  # accurate without letting a burst exceed the link for long.
  tc -n "$ns" qdisc add dev e0 root tbf rate "$rate" burst 256kb latency 50ms
  NETEM_HOSTS+="${NETEM_HOSTS:+ }$ns"
  NETEM_ADDRS+="${NETEM_ADDRS:+ }$addr"
done
export NETEM_NAME="$name" NETEM_RATE="$rate" NETEM_HOSTS NETEM_ADDRS
if [[ -n "${up_only:-}" ]]; then  # The caller removes them (--down).
  trap - EXIT INT TERM
  echo "$NETEM_ADDRS"
  exit 0
fi

set +e
"$@" &
child=$!
wait "$child"
status=$?
child=""
exit "$status"
