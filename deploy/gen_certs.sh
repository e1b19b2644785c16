#!/usr/bin/env bash
# Makes what a secured cluster needs, with openssl, into DIR:
#   ca.pem, ca.key          a CA of its own (keep ca.key off the cluster)
#   server.pem, server.key  the shards' certificate: DNS names localhost,
#                           shard0, shard1, shard-N.asyncps-shards (N < 8),
#                           *.asyncps-shards, IP 127.0.0.1, and any NAME given;
#                           for clients too (a replicated shard's backup
#                           presents it to its primary)
#   client.pem, client.key  the workers', the evaluator's and psctl's
#   token                   a random bearer token (--auth_token_file)
#   admin_token             the operators' token (--admin_token_file): give
#                           it to the shards and psctl, not to the workers
#   member_token            a replicated group's members' token
#                           (--member_token_file): the shards' only
# Keys are EC P-256; certificates last 30 days. Files that exist are kept.
#   deploy/gen_certs.sh DIR [NAME...]
set -euo pipefail
dir=${1:?usage: gen_certs.sh DIR [NAME...]}
shift
mkdir -p "$dir"
cd "$dir"
umask 077
days=30
if [[ ! -f ca.pem ]]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout ca.key -out ca.pem -days "$days" -subj "/CN=asyncps test CA" \
    2>/dev/null
fi
# sign NAME SUBJECT_ALT_NAMES EXTENDED_KEY_USAGE
sign() {
  [[ -f "$1.pem" ]] && return 0
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -keyout "$1.key" -out "$1.csr" -subj "/CN=asyncps $1" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=%s\n' "$2" "$3" >"$1.ext"
  openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial \
    -out "$1.pem" -days "$days" -extfile "$1.ext" 2>/dev/null
  rm -f "$1.csr" "$1.ext"
}
names="DNS:localhost,IP:127.0.0.1,DNS:shard0,DNS:shard1,DNS:*.asyncps-shards"
for ((n = 0; n < 8; n++)); do names+=",DNS:shard-$n.asyncps-shards"; done
for extra in "$@"; do names+=",DNS:$extra"; done
sign server "$names" serverAuth,clientAuth
sign client "DNS:asyncps-client" clientAuth
if [[ ! -f token ]]; then openssl rand -hex 32 >token; fi
if [[ ! -f admin_token ]]; then openssl rand -hex 32 >admin_token; fi
if [[ ! -f member_token ]]; then openssl rand -hex 32 >member_token; fi
chmod a+r ca.pem server.pem client.pem
echo "$(pwd): ca.pem, server.pem/.key, client.pem/.key, token, admin_token, member_token"
