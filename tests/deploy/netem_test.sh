#!/usr/bin/env bash
# deploy/netem_cluster.sh for real (root, network namespaces, tc's tbf):
# iperf3 between two emulated hosts measures the rate set, within 5 % of
# what TCP can carry over it (1448 bytes of payload in a 1514-byte frame);
# the namespaces are gone afterwards, also after the script is sent
# SIGTERM mid-command. Skipped, saying why, where the kernel or the
# permissions lack what it needs.
set -uo pipefail
export PATH="$PATH:/usr/sbin:/sbin"  # ip, tc, ss
here=$(cd "$(dirname "$0")/../.." && pwd)
script=$(find "$here" -path '*deploy/netem_cluster.sh' -print -quit)
[[ -x "$script" ]] || { echo "FAIL: deploy/netem_cluster.sh not found"; exit 1; }
name="nt$$"
fail() { echo "FAIL: $*"; "$script" --down "$name"; "$script" --down "${name}i"; exit 1; }

if ! command -v iperf3 >/dev/null; then
  echo "SKIPPED: no iperf3 (deploy/install_deps.sh installs it)"; exit 0
fi
if ! ip netns add "${name}probe" 2>/dev/null; then
  echo "SKIPPED: cannot create network namespaces here (root and CONFIG_NET_NS needed)"; exit 0
fi
ip netns del "${name}probe"

# The rate a link of 200 Mbit/s carries as TCP payload.
rate=200
out=$("$script" --hosts 2 --link "${rate}mbit" --name "$name" -- bash -c '
  set -e
  server="$NETEM_NAME-h1"
  ip netns exec "$server" iperf3 -s -1 -p 5201 >/dev/null &
  for ((i = 0; i < 500; i++)); do  # Until it listens (at most 5 s).
    ip netns exec "$server" ss -Hltn "sport = :5201" | grep -q LISTEN && break
    sleep 0.01
  done
  ip netns exec "$NETEM_NAME-h0" iperf3 -c 198.18.0.2 -p 5201 -t 2 -J
') || fail "the emulated run failed: $out"
bps=$(python3 -c 'import json, sys
print(json.loads(sys.stdin.read())["end"]["sum_received"]["bits_per_second"])' <<<"$out") ||
  fail "iperf3 said: $out"
python3 - "$bps" "$rate" <<'PY' || fail "rate"
import sys
bps, rate = float(sys.argv[1]), float(sys.argv[2]) * 1e6
payload = rate * 1448 / 1514  # TCP's share of each frame tbf counts.
ratio = bps / payload
print(f"iperf3 over a {rate / 1e6:.0f} Mbit/s link: {bps / 1e6:.1f} Mbit/s "
      f"of payload, {ratio:.3f} of the {payload / 1e6:.1f} TCP can carry")
sys.exit(0 if 0.95 <= ratio <= 1.05 else 1)
PY
left=$(ip netns list | awk '{print $1}' | grep -E "^$name-" || true)
[[ -z "$left" ]] || fail "namespaces left after the run: $left"

# Interrupted mid-command: SIGTERM to the script removes everything.
fifo=$(mktemp -u)
mkfifo "$fifo"
"$script" --hosts 2 --name "${name}i" -- bash -c "echo up > $fifo; exec sleep 3001" &
pid=$!
read -r _ <"$fifo"  # The hosts exist and the command runs.
rm -f "$fifo"
[[ -n $(ip netns list | grep -E "^${name}i-h1") ]] || fail "no host while the command ran"
kill -TERM "$pid"
wait "$pid"
status=$?
((status == 143)) || fail "the interrupted script exited $status, not 143"
left=$(ip netns list | awk '{print $1}' | grep -E "^${name}i-" || true)
[[ -z "$left" ]] || fail "namespaces left after SIGTERM: $left"
! pgrep -fx "sleep 3001" >/dev/null || fail "the command outlived the script"
echo "PASS"
