#!/usr/bin/env bash
# The compose cluster for real: starts the Docker engine if it is not
# running, builds the images (what is missing), brings up 2 shards, 2
# workers (ranks assigned by the servers), the evaluator and Prometheus,
# waits until the evaluator reports >= 0.80 test accuracy, crashes shard 0
# (SIGKILL to its process, as a real crash: `docker kill` would count as a
# manual stop, which restart policies leave down), sees the restart policy
# bring it back from its checkpoint and the training finish, and checks
# that the containers use only the project's own network. `docker-compose
# down -v` runs at the end, pass or fail, and nothing of the project may
# remain.
#   compose_test.sh [replicated]
# replicated: docker-compose.replicated.yml (etcd, each shard a group of two
# members); the crash hits shard 0's primary, whose backup takes over; the
# crashed member comes back by its restart policy and joins as a backup.
set -euo pipefail
variant=${1:-plain}
# One compose test at a time (the other waits here, not Bazel's whole
# suite): the one that started dockerd stops it at its end, which would pull
# the engine from under the other (CI of stop 47: "worker ranks: ''" after
# a FileNotFoundError on docker.sock), and 2 cores do not carry two
# clusters at once. The lock goes with this process.
exec 9>/tmp/asyncps-compose.lock
flock 9
root="$TEST_SRCDIR/$TEST_WORKSPACE"
tmp="$TEST_TMPDIR/compose"
mkdir -p "$tmp/out"
chmod a+rwx "$tmp/out"
fail() { echo "FAIL: $*" >&2; exit 1; }
deploy="$root/deploy"

started_dockerd=$("$deploy/docker/ensure_dockerd.sh")
project="asyncpstest$$"
# Fewer epochs replicated: its crash needs no checkpoint first.
epochs=12
if [[ "$variant" == replicated ]]; then epochs=5; fi
export ASYNCPS_OUT="$tmp/out" ASYNCPS_WORKERS=2 ASYNCPS_EPOCHS=$epochs \
  ASYNCPS_EVAL_EVERY=1s ASYNCPS_CHECKPOINT_EVERY=1s ASYNCPS_MODE=async
# The compose file's relative mounts resolve against its own folder; the
# runfiles tree holds it and what it mounts.
file="$deploy/docker-compose.yml"
servers=shard0:5000,shard1:5000
if [[ "$variant" == replicated ]]; then
  file="$deploy/docker-compose.replicated.yml"
  servers="shard0a:5000|shard0b:5000,shard1a:5000|shard1b:5000"
fi
compose() { docker-compose -p "$project" -f "$file" "$@"; }
cleanup() {
  local rc=$?
  compose logs --no-color >"$tmp/cluster.log" 2>&1 || true
  compose down -v --remove-orphans >/dev/null 2>&1 || true
  if ((rc != 0)); then
    echo "--- last lines of the cluster's logs" >&2
    tail -n 40 "$tmp/cluster.log" >&2 || true
  fi
  if [[ -n "$started_dockerd" ]]; then
    kill "$started_dockerd" 2>/dev/null || true
  fi
}
trap cleanup EXIT

"$deploy/docker/build_images.sh" "$root" 2>&1 | grep "^==" || fail "building the images"
compose config -q || fail "docker-compose config"
compose up -d --scale worker=2 >"$tmp/up.log" 2>&1 || { cat "$tmp/up.log" >&2; fail "up"; }

# The newest accuracy in the curve (0 while there is none).
accuracy() { tail -n 1 "$tmp/out/curve.csv" 2>/dev/null | awk -F, 'NR == 1 && $4 + 0 == $4 {print $4; exit} END {if (NR == 0) print 0}'; }
wait_until() {  # wait_until SECONDS DESCRIPTION COMMAND...
  local limit=$1 what=$2
  shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    ((SECONDS < deadline)) || fail "$what: not within $limit s"
    sleep 0.5
  done
}
accurate() { awk -v a="$(accuracy)" 'BEGIN {exit !(a >= 0.80)}'; }
wait_until 300 "test accuracy >= 0.80" accurate
echo "accuracy $(accuracy) before the crash"

# Every container is on the project's network and no other.
for id in $(compose ps -q); do
  nets=$(docker inspect -f '{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}' "$id")
  [[ "$nets" == "${project}_asyncps " ]] || fail "container $id is on networks '$nets'"
done

if [[ "$variant" == replicated ]]; then
  # psctl status lists each group's members and roles.
  primary=$(compose exec -T evaluator psctl --servers="$servers" status |
    awk '$1 == 0 && $3 == "primary" {split($2, a, ":"); print a[1]}')
  [[ "$primary" == shard0a || "$primary" == shard0b ]] ||
    fail "no primary of shard 0 in psctl status"
  backup=$([[ "$primary" == shard0a ]] && echo shard0b || echo shard0a)
  victim=$(compose ps -q "$primary")
  promoted() { docker logs "$(compose ps -q "$backup")" 2>&1 | grep -q "is the primary now"; }
else
  primary=shard0
  victim=$(compose ps -q shard0)
  wait_until 60 "a checkpoint of shard 0" \
    sh -c "docker exec $victim sh -c 'ls /checkpoints/shard-0-*.ckpt' >/dev/null 2>&1"
fi

pid=$(docker inspect -f '{{.State.Pid}}' "$victim")
started=$(docker inspect -f '{{.State.StartedAt}}' "$victim")
kill -KILL "$pid"
restarted() {
  [[ "$(docker inspect -f '{{.State.Running}} {{.State.StartedAt}}' "$victim")" == "true "* ]] &&
    [[ "$(docker inspect -f '{{.State.StartedAt}}' "$victim")" != "$started" ]]
}
wait_until 60 "$primary restarted by its restart policy" restarted
if [[ "$variant" == replicated ]]; then
  wait_until 60 "$backup promoted" promoted
  rejoined() { docker logs "$(compose ps -q "$backup")" 2>&1 | grep -q "backup $primary:5000 in sync"; }
  wait_until 60 "$primary back as a backup of $backup" rejoined
  echo "$primary killed: $(docker logs "$(compose ps -q "$backup")" 2>&1 | grep -m1 'is the primary now')"
else
  wait_until 60 "shard 0 restored from its checkpoint" \
    sh -c "docker logs $victim 2>&1 | grep -q 'restored'"
  echo "shard 0 restarted: $(docker logs "$victim" 2>&1 | grep -m1 restored)"
fi

# Training goes on and finishes: both workers exit 0.
workers_done() {
  local id
  for id in $(compose ps -q worker); do
    [[ "$(docker inspect -f '{{.State.Running}}' "$id")" == false ]] || return 1
  done
}
wait_until 300 "the workers to finish" workers_done
for id in $(compose ps -q worker); do
  code=$(docker inspect -f '{{.State.ExitCode}}' "$id")
  ((code == 0)) || fail "worker $id exited $code"
done
ranks=$(for id in $(compose ps -q worker); do docker logs "$id" 2>&1 | grep -o "^rank [0-9]* done"; done | sort | tr '\n' ' ')
[[ "$ranks" == "rank 0 done rank 1 done " ]] || fail "worker ranks: '$ranks'"
# The trained model comes out to the host as compose_cluster.sh takes it:
# psctl export from the evaluator's container into the mounted OUT.
compose exec -T evaluator psctl --servers="$servers" \
  export --format=npz --out=/out/model.npz >"$tmp/export.log" 2>&1 ||
  { cat "$tmp/export.log" >&2; fail "psctl export in the evaluator"; }
/usr/bin/python3 - "$tmp/out/model.npz" <<'PY' || fail "the exported model.npz"
import sys, numpy
z = numpy.load(sys.argv[1])
# The MLP 784-256-128-10: its weights and biases, all finite and trained.
sizes = sorted(z[n].size for n in z.files)
assert sizes == [10, 128, 256, 1280, 32768, 200704], (z.files, sizes)
assert all(numpy.isfinite(z[n]).all() for n in z.files)
print("model.npz:", ", ".join(f"{n} {z[n].shape}" for n in sorted(z.files)))
PY
compose stop -t 30 evaluator >/dev/null 2>&1
final=$(accuracy)
awk -v a="$final" 'BEGIN {exit !(a >= 0.80)}' || fail "final accuracy $final"
echo "final accuracy $final"

compose down -v --remove-orphans >/dev/null 2>&1
left=$(docker ps -aq --filter "label=com.docker.compose.project=$project"; \
  docker network ls -q --filter "label=com.docker.compose.project=$project"; \
  docker volume ls -q --filter "label=com.docker.compose.project=$project")
[[ -z "$left" ]] || fail "left behind after down -v: $left"
echo PASS
