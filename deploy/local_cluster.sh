#!/usr/bin/env bash
# Brings up an asyncps cluster as plain processes on 127.0.0.1, trains the
# MLP on Fashion-MNIST, shows the test accuracy climbing, and shuts every
# process down at the end or on Ctrl-C.
#
#   deploy/local_cluster.sh [--workers N] [--shards N] [--epochs N]
#                           [--mode async] [--out DIR] [--checkpoint_every D]
#                           [--metrics_base PORT] [--tls] [--replicas N]
#                           [-- ps_worker flags...]
#
# Defaults: 2 shards, 2 workers, 5 epochs, async. --mode (async, ssp, bsp,
# allreduce) goes to the servers and the workers alike. Logs, checkpoints
# (every 30s by default, and at exit; "off" for none), the evaluator's
# curve (CSV) and the trained model (model.npz, psctl export) go to --out
# (default: a fresh directory under /tmp).
# Every process serves Prometheus' /metrics: shard s on PORT + s, the
# evaluator on PORT + shards, worker r on PORT + shards + 1 + r (default
# PORT 9400; 0: none); --out gets a prometheus.yml scraping them all.
# --tls: mutual TLS and a bearer token on every gRPC channel, with a CA and
# certificates deploy/gen_certs.sh makes in --out/certs (docs/SECURITY.md).
# --replicas N (2 or 3): each shard a group of N ps_server processes with a
# private etcd (docs/DESIGN.md "Replicated shards"); member m of shard s is
# process s*N+m for the metrics ports above, and psctl status at the end
# lists the groups.
set -euo pipefail
cd "$(dirname "$0")/.."

workers=2
shards=2
epochs=5
mode=async
out=""
extra=()
checkpoint_every=30s
metrics_base=9400
tls=0
replicas=0
usage() { sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --shards) shards="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --checkpoint_every) checkpoint_every="$2"; shift 2 ;;
    --metrics_base) metrics_base="$2"; shift 2 ;;
    --tls) tls=1; shift ;;
    --replicas) replicas="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    --) shift; extra=("$@"); break ;;
    *) echo "local_cluster.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in workers shards epochs; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "local_cluster.sh: --$v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done
if ! [[ "$replicas" =~ ^[0-9]$ ]] || ((replicas == 1)); then
  echo "local_cluster.sh: --replicas must be 2 or 3 (0: none), not '$replicas'" >&2
  exit 2
fi
# Server processes: a shard each, or a group of --replicas each.
procs=$((replicas > 0 ? shards * replicas : shards))
if ! [[ "$metrics_base" =~ ^[0-9]+$ ]] ||
  ((metrics_base != 0 && (metrics_base < 1024 || metrics_base + procs + workers + 1 > 65535))); then
  echo "local_cluster.sh: --metrics_base must be 0 or a port in [1024, 65535 - servers - workers - 1], not '$metrics_base'" >&2
  exit 2
fi
if [[ -z "$out" ]]; then out=$(mktemp -d /tmp/asyncps-cluster.XXXXXX); fi
mkdir -p "$out"

deploy/install_deps.sh
echo "== building"
bazel build --noshow_progress //server:ps_server //worker:ps_worker //tools:psctl
bin=$(bazel info bazel-bin 2>/dev/null)
# Private copies, so a rebuild during the run cannot pull them away.
rm -f "$out/ps_server" "$out/ps_worker" "$out/psctl"
cp "$bin/server/ps_server" "$bin/worker/ps_worker" "$bin/tools/psctl" "$out/"
bazel shutdown

pids=()
cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do
    for _ in $(seq 150); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$p" 2>/dev/null || true
    wait "$p" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap 'echo; echo "== interrupted: stopping the cluster"; exit 130' INT TERM

server_tls=()
client_tls=()
if ((tls)); then
  deploy/gen_certs.sh "$out/certs" >/dev/null
  c="$out/certs"
  server_tls=(--tls_cert="$c/server.pem" --tls_key="$c/server.key" --tls_ca="$c/ca.pem" --auth_token_file="$c/token" --admin_token_file="$c/admin_token")
  client_tls=(--tls_cert="$c/client.pem" --tls_key="$c/client.key" --tls_ca="$c/ca.pem" --auth_token_file="$c/token")
  echo "== mutual TLS and a token (certificates in $c; psctl needs: ${client_tls[*]}, and --admin_token_file=$c/admin_token to checkpoint)"
  # A group's members join one another with their own credential.
  if ((replicas > 0)); then server_tls+=(--member_token_file="$c/member_token"); fi
fi

echo "== starting $shards shards"
ckpt=()
if [[ "$checkpoint_every" != off ]]; then
  mkdir -p "$out/checkpoints"
  ckpt=(--checkpoint_dir="$out/checkpoints" --checkpoint_every="$checkpoint_every")
  echo "   checkpoints every $checkpoint_every in $out/checkpoints"
fi
server_flags=(--num_workers="$workers" ${ckpt[@]+"${ckpt[@]}"} ${server_tls[@]+"${server_tls[@]}"})
if ((replicas == 0)); then
  # python/package/cluster.py, the shards' launcher, prints the servers line
  # once every shard serves, and stops them (drained) on SIGTERM.
  exec {shards_fd}< <(exec python3 python/package/cluster.py \
    --ps_server="$out/ps_server" --shards="$shards" --mode="$mode" \
    --log_dir="$out" --metrics_base="$metrics_base" \
    "${server_flags[@]/#/--server_flag=}")
  pids+=($!)
  read -r servers <&"$shards_fd" || { echo "the shards did not start; see $out/server*.log" >&2; exit 1; }
else
  free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
  etcd_port=$(free_port)
  peer_port=$(free_port)
  echo "   etcd on 127.0.0.1:$etcd_port (log $out/etcd.log); $replicas members per shard"
  # Elections of 500 ms, so that it grants leases of 1 s (--lease_ttl).
  etcd --name=asyncps --data-dir="$out/etcd" \
    --listen-client-urls="http://127.0.0.1:$etcd_port" \
    --advertise-client-urls="http://127.0.0.1:$etcd_port" \
    --listen-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-advertise-peer-urls="http://127.0.0.1:$peer_port" \
    --initial-cluster="asyncps=http://127.0.0.1:$peer_port" \
    --heartbeat-interval=50 --election-timeout=500 >"$out/etcd.log" 2>&1 &
  etcd_pid=$!
  servers=""
  for ((s = 0; s < shards; s++)); do
    group=""
    for ((m = 0; m < replicas; m++)); do
      port=$(free_port)
      k=$((s * replicas + m))
      metrics=()
      if ((metrics_base > 0)); then metrics=(--metrics_port=$((metrics_base + k))); fi
      member_ckpt=()
      if [[ "$checkpoint_every" != off ]]; then
        mkdir -p "$out/checkpoints/member-$s-$m"
        member_ckpt=(--checkpoint_dir="$out/checkpoints/member-$s-$m" --checkpoint_every="$checkpoint_every")
      fi
      # Member 0 creates its new group (these processes are not restarted).
      bootstrap=()
      if ((m == 0)); then bootstrap=(--bootstrap); fi
      "$out/ps_server" --host=127.0.0.1 --port="$port" --shard="$s" \
        --num_shards="$shards" --mode="$mode" --num_workers="$workers" \
        --replicas="$replicas" --etcd="127.0.0.1:$etcd_port" --job=local \
        "${bootstrap[@]+"${bootstrap[@]}"}" \
        --advertise="127.0.0.1:$port" --ready_file="$out/ready-$k.json" \
        ${metrics[@]+"${metrics[@]}"} ${member_ckpt[@]+"${member_ckpt[@]}"} \
        ${server_tls[@]+"${server_tls[@]}"} >/dev/null 2>"$out/server$s-$m.log" &
      pids+=($!)
      group+="${group:+|}127.0.0.1:$port"
    done
    servers+="${servers:+,}$group"
  done
  for ((k = 0; k < procs; k++)); do
    for _ in $(seq 300); do [[ -s "$out/ready-$k.json" ]] && break; sleep 0.1; done
    [[ -s "$out/ready-$k.json" ]] || { echo "server $k did not start; see $out/server*.log" >&2; exit 1; }
  done
  # etcd goes last, once the members stepped down.
  pids+=($etcd_pid)
fi
echo "   servers: $servers"

# Metrics ports of the evaluator and of worker r (none when the base is 0).
metrics_flag() {
  if ((metrics_base > 0)); then echo "--metrics_port=$((metrics_base + procs + $1))"; fi
}
# "127.0.0.1:P", ... for COUNT ports from FIRST.
targets() {
  local i
  for ((i = 0; i < $2; i++)); do
    printf '%s"127.0.0.1:%d"' "$( ((i == 0)) || echo ', ')" $(($1 + i))
  done
}
if ((metrics_base > 0)); then
  {
    echo "# Written by deploy/local_cluster.sh: prometheus --config.file=$out/prometheus.yml"
    echo "global: {scrape_interval: 5s}"
    echo "scrape_configs:"
    echo "  - job_name: asyncps-shards"
    echo "    static_configs: [{targets: [$(targets "$metrics_base" "$procs")]}]"
    echo "  - job_name: asyncps-evaluator"
    echo "    static_configs: [{targets: [$(targets $((metrics_base + procs)) 1)]}]"
    echo "  - job_name: asyncps-workers"
    echo "    static_configs: [{targets: [$(targets $((metrics_base + procs + 1)) "$workers")]}]"
  } >"$out/prometheus.yml"
  echo "   metrics: servers on :$metrics_base..$((metrics_base + procs - 1)), evaluator on :$((metrics_base + procs)), workers on :$((metrics_base + procs + 1))..$((metrics_base + procs + workers)) (/metrics; scrape config $out/prometheus.yml)"
fi

echo "== starting the evaluator and $workers workers (mode $mode, $epochs epochs)"
echo "   the evaluator's test accuracy every 10 s: lines starting [eval]"
"$out/ps_worker" --role=evaluator --servers="$servers" --eval_every=10s \
  --curve="$out/curve.csv" $(metrics_flag 0) ${client_tls[@]+"${client_tls[@]}"} \
  2>"$out/evaluator.log" | sed -u 's/^/[eval] /' &
eval_pid=$!
pids+=($eval_pid)
worker_pids=()
for ((r = 0; r < workers; r++)); do
  "$out/ps_worker" --servers="$servers" --rank=$r --num_workers="$workers" \
    --mode="$mode" --epochs="$epochs" --log_every=10s $(metrics_flag $((1 + r))) \
    ${client_tls[@]+"${client_tls[@]}"} ${extra[@]+"${extra[@]}"} \
    2>"$out/worker$r.log" | sed -u "s/^/[worker $r] /" &
  worker_pids+=($!)
  pids+=($!)
done

start=$(date +%s)
status=0
for p in "${worker_pids[@]}"; do wait "$p" || status=1; done
if ((status != 0)); then
  echo "== a worker failed; its log is in $out" >&2
  tail -n 3 "$out"/worker*.log >&2
fi
echo "== training took $(($(date +%s) - start)) s; final evaluation"
# The evaluator scores once more on SIGTERM, then exits.
pkill -TERM -f "^$out/ps_worker --role=evaluator" || true
wait "$eval_pid" || true
echo "== curve: $out/curve.csv"
# The trained model, by tensor name, before the shards stop (numpy.load).
"$out/psctl" --servers="$servers" ${client_tls[@]+"${client_tls[@]}"} \
  export --format=npz --out="$out/model.npz" || status=1
if ((replicas > 0)); then
  "$out/psctl" --servers="$servers" ${client_tls[@]+"${client_tls[@]}"} status || true
fi
tail -n 1 "$out/curve.csv" | awk -F, '{printf "== final test accuracy %.4f after %.0f updates\n", $4, $2}'
exit $status
