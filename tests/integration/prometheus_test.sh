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
# Last started first: the worker leaves before its shard stops (it would
# otherwise retry the stopped shard for --retry_for).
cleanup() {
  local i
  for ((i = ${#pids[@]} - 1; i >= 0; i--)); do
    kill -TERM "${pids[i]}" 2>/dev/null || true
    wait "${pids[i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT

# Ports nothing listens on now (the kernel's picks, released).
read -r shard_metrics worker_metrics prom_port < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(3)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

# The shards' launcher prints the servers line once the shard serves (and
# stops it on SIGTERM).
exec {shards_fd}< <(exec /usr/bin/python3 "$root/python/package/cluster.py" \
  --ps_server="$root/server/ps_server" --log_dir="$tmp" \
  --metrics_base="$shard_metrics")
pids+=($!)
read -r servers <&"$shards_fd" || fail "the shard did not start: $(tail -3 "$tmp/server0.log")"
"$root/worker/ps_worker" --servers="$servers" --epochs=100000 --slowdown=3 \
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
            # One owner per series: the shard's view of the worker is
            # named apart, so summing the worker's own counts it once.
            assert len(rate) == 1, rate
            assert query("asyncps_shard_worker_samples_per_second"), "no shard view"
            # Every process says what it was built from, and its process_*.
            info = query("asyncps_build_info")
            assert len(info) == 2 and all(i["metric"]["commit"] for i in info), info
            assert len(query("process_resident_memory_bytes")) == 2
            break
    except (OSError, ValueError, KeyError):
        pass  # Prometheus is still starting.
    if time.time() > deadline:
        sys.exit("no positive asyncps_worker_samples_per_second within 120 s")
    time.sleep(0.5)
PY
echo "PASS"
