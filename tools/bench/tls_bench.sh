#!/usr/bin/env bash
# What TLS costs the data plane: ps_bench push-pull against two local shards
# in plaintext, then with mutual TLS over the data plane, then with TLS over
# gRPC (how a secured cluster moved its tensors before the data plane had
# TLS), REPS times in turn, each line with its ratio to the plaintext run
# just before it; and the CPU's ceiling for TLS in the same rep: with the
# client and the shards on this machine's cores, every byte is encrypted
# once and decrypted once on top of what plaintext costs, so at best
#   1 / (1 / plaintext + 2 / (cores x AES-256-GCM rate of one core))
# (the rate from `openssl speed`, the cipher TLS 1.3 picks first).
#   tools/bench/tls_bench.sh [REPS] [ps_bench flags...]     e.g. 3 --clients=2
if [[ "${1:-}" == -h || "${1:-}" == --help ]]; then  # the comment above
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 0
fi
set -euo pipefail
cd "$(dirname "$0")/../.."
reps=${1:-3}
shift || true
deploy/install_deps.sh
bazel build //server:ps_server //tools/bench:ps_bench
bin=$(mktemp -d /tmp/tls_bench.XXXXXX)
cp bazel-bin/server/ps_server bazel-bin/tools/bench/ps_bench "$bin/"
bazel shutdown
trap 'rm -rf "$bin"' EXIT
deploy/gen_certs.sh "$bin/certs" >/dev/null
tls() {  # $1: server or client
  echo "--tls_cert=$bin/certs/$1.pem --tls_key=$bin/certs/$1.key" \
    "--tls_ca=$bin/certs/ca.pem"
}
# One ps_bench run; prints its gb_per_s.
run() {  # $1: server flags, $2...: ps_bench flags
  local server_flags=$1
  shift
  local args=()
  for f in $server_flags; do args+=("--server_flag=$f"); done
  python3 python/package/cluster.py --ps_server="$bin/ps_server" --shards=2 \
    "${args[@]}" -- "$bin/ps_bench" --servers={servers} "$@" |
    tail -n +2 | tee /dev/stderr | sed -n 's/.*gb_per_s=\([0-9.]*\).*/\1/p'
}
for ((r = 1; r <= reps; r++)); do
  plain=$(run "" --transport=tcp "$@")
  data_tls=$(run "$(tls server)" --transport=tcp $(tls client) "$@")
  grpc_tls=$(run "$(tls server)" --transport=grpc $(tls client) "$@")
  # k bytes per second, 16 KiB blocks (a TLS record).
  aes=$(openssl speed -evp aes-256-gcm -seconds 2 -bytes 16384 2>/dev/null |
    awk '/^AES-256-GCM/ {sub(/k$/, "", $2); print $2 * 1000}')
  python3 -c "import sys; p, d, g, aes, cores = map(float, sys.argv[1:]); \
ceiling = 1 / (1 / p + 2 / (cores * aes / 1e9)); \
print(f'rep $r: plaintext {p:.3f} GB/s; data plane + TLS {d:.3f} GB/s = \
{d / p:.2f}x plaintext, {d / ceiling:.2f}x the CPU ceiling for TLS \
({ceiling:.2f} GB/s = {ceiling / p:.2f}x plaintext: AES-256-GCM \
{aes / 1e9:.2f} GB/s a core, {cores:.0f} cores); gRPC + TLS {g:.3f} GB/s \
= {g / p:.2f}x')" "$plain" "$data_tls" "$grpc_tls" "$aes" "$(nproc)"
done
