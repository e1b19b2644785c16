#!/usr/bin/env bash
# Prometheus itself (Debian's prometheus package) scrapes a shard and a
# worker started with --metrics_port, loads deploy/alerts.yml, and its
# query API returns the worker's samples/s. Every process is stopped at the
# end, pass or fail.
set -euo pipefail
root="$TEST_SRCDIR/$TEST_WORKSPACE"
tmp="$TEST_TMPDIR/prom"
mkdir -p "$tmp"
fail() { echo "FAIL: $*" >&2; exit 1; }

pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap cleanup EXIT

# Ports nothing listens on now (the kernel's picks, released).
read -r shard_metrics worker_metrics prom_port < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

# Created first: the server's redirection happens in the child, possibly
# after tail below has looked for the file.
: >"$tmp/server.out"
"$root/server/ps_server" --host=127.0.0.1 --port=0 \
  --metrics_port="$shard_metrics" >"$tmp/server.out" 2>"$tmp/server.log" &
pids+=($!)
line=$(timeout 30 tail -n +1 -f "$tmp/server.out" | grep -m1 "listening on" || true)
[[ -n "$line" ]] || fail "the shard did not start: $(tail -3 "$tmp/server.log")"
"$root/worker/ps_worker" --servers="${line##* }" --steps=1000000 --slowdown=3 \
  --metrics_port="$worker_metrics" >"$tmp/worker.out" 2>"$tmp/worker.log" &
pids+=($!)

cp "$root/deploy/alerts.yml" "$tmp/alerts.yml"
cat >"$tmp/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [alerts.yml]
scrape_configs:
  - job_name: asyncps-shards
    static_configs: [{targets: ["127.0.0.1:$shard_metrics"]}]
  - job_name: asyncps-workers
    static_configs: [{targets: ["127.0.0.1:$worker_metrics"]}]
YML
promtool check config "$tmp/prometheus.yml" >/dev/null || fail "promtool check config"
# The shipped configuration is valid too.
cp "$root/deploy/prometheus.yml" "$tmp/shipped.yml"
promtool check config "$tmp/shipped.yml" >/dev/null || fail "deploy/prometheus.yml"

prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" >"$tmp/prometheus.log" 2>&1 &
pids+=($!)

# Polls the query API (at most 120 s) until the worker's samples/s is there
# and positive, the shard is up, and the alert rules are loaded.
/usr/bin/python3 - "$prom_port" <<'PY' || { tail -20 "$tmp/prometheus.log" >&2; fail "query"; }
import json, sys, time, urllib.parse, urllib.request
port = sys.argv[1]
def get(path):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
        return json.load(r)["data"]
def query(q):
    return get("/api/v1/query?query=" + urllib.parse.quote(q))["result"]
deadline = time.time() + 120
while True:
    try:
        rate = query("asyncps_worker_samples_per_second")
        up = query('up{job="asyncps-shards"}')
        rules = [r for g in get("/api/v1/rules")["groups"] for r in g["rules"]]
        if rate and float(rate[0]["value"][1]) > 0 and up and up[0]["value"][1] == "1":
            print("samples/s", rate[0]["value"][1], "rank", rate[0]["metric"]["rank"],
                  "alert rules", len(rules))
            assert rate[0]["metric"]["rank"] == "0", rate
            assert len(rules) >= 5, rules
            # The shard's own per-call metrics are there too.
            assert query('asyncps_shard_calls_total{method="PushPull"}'), "no PushPull calls"
            break
    except (OSError, ValueError, KeyError):
        pass  # Prometheus is still starting.
    if time.time() > deadline:
        sys.exit("no positive asyncps_worker_samples_per_second within 120 s")
    time.sleep(0.5)
PY
echo "PASS"
