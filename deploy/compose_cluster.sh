#!/usr/bin/env bash
# Brings the asyncps cluster up in containers with docker-compose: builds
# the binaries and whatever images are missing, starts 2 shards, N workers,
# the evaluator and Prometheus, shows the evaluator's accuracy as it goes,
# and tears everything down (containers, network, volumes) when training
# ends or on Ctrl-C.
#
#   deploy/compose_cluster.sh [--workers N] [--mode async] [--epochs N]
#                             [--out DIR] [--gpu] [--tls] [--replicated]
#                             [--keep]
#
# Defaults: 2 workers, async, 3 epochs. --out (default: a fresh directory
# under /tmp) gets the evaluator's curve.csv, the trained model
# (model.npz, psctl export) and the containers' logs.
# --gpu adds docker-compose.gpu.yml (one NVIDIA GPU per worker; needs the
# NVIDIA container toolkit). --tls adds docker-compose.tls.yml: mutual TLS
# and a token on every gRPC channel, certificates from deploy/gen_certs.sh
# in --out/certs. --keep leaves the cluster up after training
# (docker-compose -p asyncps -f deploy/docker-compose.yml down -v ends it).
set -euo pipefail
cd "$(dirname "$0")/.."

workers=2
mode=async
epochs=3
out=""
gpu=0
tls=0
keep=0
replicated=0
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; }
while (($#)); do
  case "$1" in
    --workers) workers="$2"; shift 2 ;;
    --mode) mode="$2"; shift 2 ;;
    --epochs) epochs="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    --gpu) gpu=1; shift ;;
    --tls) tls=1; shift ;;
    --keep) keep=1; shift ;;
    --replicated) replicated=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "compose_cluster.sh: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
done
for v in workers epochs; do
  if ! [[ "${!v}" =~ ^[1-9][0-9]*$ ]]; then
    echo "compose_cluster.sh: --$v must be a positive integer, not '${!v}'" >&2
    exit 2
  fi
done
if ((replicated && (gpu || tls))); then
  echo "compose_cluster.sh: --replicated goes without --gpu and --tls (not built yet)" >&2
  exit 2
fi
if [[ -z "$out" ]]; then out=$(mktemp -d /tmp/asyncps-compose.XXXXXX); fi
mkdir -p "$out"
chmod a+rwx "$out"  # The containers' user (uid 10001) writes the curve.
out=$(cd "$out" && pwd)

deploy/install_deps.sh
deploy/docker/ensure_dockerd.sh >/dev/null
echo "== building"
bazel build --noshow_progress //server:ps_server //worker:ps_worker //tools:psctl
cuda=()
if ((gpu)); then
  bin=$(mktemp -d /tmp/asyncps-cuda.XXXXXX)
  bazel build --noshow_progress --config=cuda //worker:ps_worker
  cp "$(bazel info bazel-bin 2>/dev/null)/worker/ps_worker" "$bin/"
  cuda=(--cuda "$bin/ps_worker" /usr/local/cuda/lib64)
  bazel build --noshow_progress //server:ps_server //worker:ps_worker //tools:psctl
fi
deploy/docker/build_images.sh "$(bazel info bazel-bin 2>/dev/null)" ${cuda[@]+"${cuda[@]}"}

files=(-f deploy/docker-compose.yml)
servers=shard0:5000,shard1:5000
if ((replicated)); then
  files=(-f deploy/docker-compose.replicated.yml)
  servers="shard0a:5000|shard0b:5000,shard1a:5000|shard1b:5000"
fi
if ((gpu)); then files+=(-f deploy/docker-compose.gpu.yml); fi
if ((tls)); then
  deploy/gen_certs.sh "$out/certs" >/dev/null
  chown -R 10001 "$out/certs"  # The containers' user reads the keys.
  export ASYNCPS_CERTS="$out/certs"
  files+=(-f deploy/docker-compose.tls.yml)
  echo "== mutual TLS and a token: certificates in $out/certs"
fi
export ASYNCPS_MODE=$mode ASYNCPS_WORKERS=$workers ASYNCPS_EPOCHS=$epochs ASYNCPS_OUT=$out
compose() { docker-compose -p asyncps "${files[@]}" "$@"; }
down() {
  trap - EXIT INT TERM
  compose logs --no-color >"$out/cluster.log" 2>&1 || true
  if ((keep)); then
    echo "== left running: docker-compose -p asyncps ${files[*]} down -v"
  else
    echo "== stopping: containers, network and volumes removed"
    compose down -v --remove-orphans >/dev/null 2>&1 || true
  fi
}
trap down EXIT
trap 'echo; echo "== interrupted"; exit 130' INT TERM

echo "== starting 2 shards$( ((replicated)) && echo " of 2 members each, etcd"), $workers workers (mode $mode, $epochs epochs), the evaluator, Prometheus"
compose up -d --scale worker="$workers" 2>&1 | grep -v "^$" | sed 's/^/   /'
echo "   curve:      $out/curve.csv"
echo "   logs:       docker-compose -p asyncps ${files[*]} logs -f (saved to $out/cluster.log at the end)"
echo "   status:     docker-compose -p asyncps ${files[*]} exec evaluator psctl --servers='$servers' status"
echo "   Prometheus: http://127.0.0.1:$(compose port prometheus 9090 | cut -d: -f2)"

# Follows the evaluator until every worker has exited.
compose logs -f --no-color evaluator 2>/dev/null | grep --line-buffered "evaluator t=" | sed -u 's/^[^|]*| /[eval] /' &
follow=$!
status=0
while true; do
  ids=$(compose ps -q worker)
  running=$(docker inspect -f '{{.State.Running}}' $ids 2>/dev/null | grep -c true || true)
  if ((running == 0)); then break; fi
  sleep 2
done
for id in $(compose ps -q worker); do
  code=$(docker inspect -f '{{.State.ExitCode}}' "$id")
  if ((code != 0)); then status=1; fi
done
kill "$follow" 2>/dev/null || true
echo "== training done (workers $( ((status == 0)) && echo "all exited 0" || echo "FAILED: see $out/cluster.log"))"
# The trained model to the host (OUT/model.npz, numpy.load) before the
# evaluator and the shards stop: psctl export from the evaluator's
# container, which mounts OUT (the container's user must be able to write
# it).
export_flags=()
if ((tls)); then
  export_flags=(--tls_cert=/certs/client.pem --tls_key=/certs/client.key
    --tls_ca=/certs/ca.pem --auth_token_file=/certs/token)
fi
chmod a+w "$out"
if compose exec -T evaluator psctl --servers="$servers" \
  ${export_flags[@]+"${export_flags[@]}"} export --format=npz \
  --out=/out/model.npz; then
  echo "== model: $out/model.npz"
else
  echo "== could not export the model (see above)" >&2
  status=1
fi
compose stop -t 30 evaluator >/dev/null 2>&1 || true
tail -n 1 "$out/curve.csv" 2>/dev/null |
  awk -F, '{printf "== final test accuracy %.4f after %.0f updates\n", $4, $2}'
exit $status
