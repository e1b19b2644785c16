#include "common/security_flags.h"

#include <string>

#include "absl/flags/flag.h"

ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this process (TLS; deploy/gen_certs.sh makes "
          "them). A server needs one for TLS; a client presents it for "
          "mutual TLS. Empty: plaintext.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate. A client trusts servers it signed (and uses "
          "TLS even without --tls_cert); a server given one requires "
          "clients to present a certificate it signed (mutual TLS).");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding the job's bearer token (one word, at least 16 "
          "characters). Servers refuse calls without it (UNAUTHENTICATED); "
          "clients send it on every call. Empty: no token.");
ABSL_FLAG(std::string, admin_token_file, "",
          "File holding the operators' token (apart from the workers' "
          "--auth_token_file). ps_server: Checkpoint calls (psctl "
          "checkpoint, pausing the job) must carry it (PERMISSION_DENIED "
          "otherwise; with --auth_token_file but no admin token they are "
          "refused outright). psctl: sends it. Empty: none.");

ABSL_FLAG(std::string, member_token_file, "",
          "ps_server --replicas: file holding the members' token (apart "
          "from the workers' and the operators'). A member sends it when it "
          "joins its group's primary, and a primary takes no backup without "
          "it: a worker's token does not let a process copy the shard or "
          "stall its pushes. Needed with --replicas when the job has TLS or "
          "a token. Empty: none.");

namespace asyncps {

SecurityFlags SecurityFlagsFromCommandLine() {
  SecurityFlags f;
  f.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  f.tls_key = absl::GetFlag(FLAGS_tls_key);
  f.tls_ca = absl::GetFlag(FLAGS_tls_ca);
  f.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  f.admin_token_file = absl::GetFlag(FLAGS_admin_token_file);
  f.member_token_file = absl::GetFlag(FLAGS_member_token_file);
  return f;
}

}  // namespace asyncps
