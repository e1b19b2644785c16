// What secures a process's gRPC channels (--tls_cert, --tls_key, --tls_ca,
// --auth_token_file on ps_server, ps_worker and psctl): TLS, mutual TLS
// when a server is given a CA, and a bearer token every call carries.
// Plaintext without a token stays the default for a local run.
// docs/SECURITY.md has the threat model. Plain data: the gRPC credentials
// are built from it at the edges (rpc/grpc_credentials.h).
#ifndef ASYNCPS_COMMON_SECURITY_H_
#define ASYNCPS_COMMON_SECURITY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

// The flags, as given (file paths; empty: not given).
struct SecurityFlags {
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  std::string auth_token_file;
  std::string admin_token_file;
  std::string member_token_file;
};

// The files' contents. The token is never logged nor put in a message.
struct Security {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  std::string token;  // Empty: calls carry none, and none is checked.
  // The operators' credential (--admin_token_file), apart from the
  // workers' token: a client sends it on every call; a server requires it
  // for the calls that stop or write the job (Checkpoint). Never logged.
  std::string admin_token;
  // The members' credential of a replicated shard group
  // (--member_token_file), apart from the workers' and the operators': a
  // member joining a primary sends it, and a primary takes no backup
  // without it (docs/SECURITY.md). Never logged.
  std::string member_token;

  bool tls() const { return !cert_pem.empty() || !ca_pem.empty(); }
  // How a process says what protects it, once, at start ("plaintext ...").
  std::string Describe(bool server) const;
};

// Reads the files `flags` names. INVALID_ARGUMENT naming the flag for an
// unreadable or empty file, a certificate without its key (or a key
// without its certificate), a token shorter than 16 characters or not one
// printable word, or an admin or member token equal to another token.
absl::StatusOr<Security> LoadSecurity(const SecurityFlags& flags);

// The contents of the file `path` that flag `flag` names ("" if the flag was
// not given); INVALID_ARGUMENT naming the flag if it cannot be read or is
// empty. For every flag that names a certificate, key or token file.
absl::StatusOr<std::string> ReadFlagFile(const std::string& flag,
                                         const std::string& path);

// The metadata key and value calls carry their token in.
inline constexpr char kAuthorizationKey[] = "authorization";
// The metadata key of the admin token (the token itself, no prefix).
inline constexpr char kAdminTokenKey[] = "x-asyncps-admin";
std::string BearerValue(absl::string_view token);

// Whether `a` and `b` are equal, in time independent of where they differ
// (for secrets: the bearer token, the data plane's connection token).
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

// Whether `header` (the call's authorization value) is "Bearer <token>",
// compared with ConstantTimeEquals.
bool TokenMatches(absl::string_view token, absl::string_view header);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SECURITY_H_
