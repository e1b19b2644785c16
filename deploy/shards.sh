# Sourced by scripts that start ps_server shards on 127.0.0.1.
#
#   start_shards BIN_DIR LOG_DIR N [ps_server flags...]
#
# Starts N shards on kernel-chosen ports, appends their pids to the array
# `pids` and sets `servers` to "127.0.0.1:p0,127.0.0.1:p1,...". If
# `metrics_base` is set above 0, shard s serves /metrics on metrics_base + s.
# Returns 1 if a shard does not start within 30 s.
start_shards() {
  local bin=$1 logs=$2 n=$3
  shift 3
  servers=""
  local s line metrics
  for ((s = 0; s < n; s++)); do
    metrics=()
    if ((${metrics_base:-0} > 0)); then
      metrics=(--metrics_port=$((metrics_base + s)))
    fi
    # Created first: tail below may look before the child's redirection.
    : >"$logs/server$s.out"
    "$bin/ps_server" --host=127.0.0.1 --port=0 --shard=$s --num_shards="$n" \
      ${metrics[@]+"${metrics[@]}"} "$@" >"$logs/server$s.out" \
      2>"$logs/server$s.log" &
    pids+=($!)
    # The server prints "... listening on 127.0.0.1:PORT" once it serves.
    line=$(timeout 30 tail -n +1 -f "$logs/server$s.out" |
      grep -m1 "listening on" || true)
    if [[ -z "$line" ]]; then
      echo "shard $s did not start; see $logs/server$s.log" >&2
      return 1
    fi
    servers+="${servers:+,}${line##* }"
  done
}
