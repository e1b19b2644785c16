#include "common/security.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<std::string> ReadFlagFile(const std::string& flag,
                                         const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": cannot read it"));
  }
  if (text.str().empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": the file is empty"));
  }
  return text.str();
}

namespace {

// Bearer tokens shorter than this are guessable.
constexpr size_t kMinTokenLength = 16;

// A token file's word (empty if `path` is): at least kMinTokenLength
// printable ASCII characters, no space.
absl::StatusOr<std::string> ReadToken(const char* flag,
                                      const std::string& path) {
  auto text = ReadFlagFile(flag, path);
  if (!text.ok()) return text.status();
  std::string token(absl::StripAsciiWhitespace(*text));
  if (!path.empty() && token.size() < kMinTokenLength) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, "=", path, ": the token has ", token.size(),
                     " characters, fewer than ", kMinTokenLength,
                     " (deploy/gen_certs.sh writes a random one)"));
  }
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag, "=", path,
                       ": the token must be printable ASCII, one word"));
    }
  }
  return token;
}

}  // namespace

absl::StatusOr<Security> LoadSecurity(const SecurityFlags& flags) {
  Security s;
  auto cert = ReadFlagFile("tls_cert", flags.tls_cert);
  if (!cert.ok()) return cert.status();
  auto key = ReadFlagFile("tls_key", flags.tls_key);
  if (!key.ok()) return key.status();
  auto ca = ReadFlagFile("tls_ca", flags.tls_ca);
  if (!ca.ok()) return ca.status();
  if (cert->empty() != key->empty()) {
    return absl::InvalidArgumentError(
        "--tls_cert and --tls_key go together: a certificate and its key");
  }
  s.cert_pem = *std::move(cert);
  s.key_pem = *std::move(key);
  s.ca_pem = *std::move(ca);
  auto token = ReadToken("auth_token_file", flags.auth_token_file);
  if (!token.ok()) return token.status();
  s.token = *std::move(token);
  auto admin = ReadToken("admin_token_file", flags.admin_token_file);
  if (!admin.ok()) return admin.status();
  s.admin_token = *std::move(admin);
  if (!s.admin_token.empty() && s.admin_token == s.token) {
    return absl::InvalidArgumentError(
        "--admin_token_file holds the same token as --auth_token_file: the "
        "operators' credential must be apart from the workers'");
  }
  auto member = ReadToken("member_token_file", flags.member_token_file);
  if (!member.ok()) return member.status();
  s.member_token = *std::move(member);
  if (!s.member_token.empty() &&
      (s.member_token == s.token || s.member_token == s.admin_token)) {
    return absl::InvalidArgumentError(
        "--member_token_file holds the same token as --auth_token_file or "
        "--admin_token_file: the members' credential must be apart");
  }
  return s;
}

std::string Security::Describe(bool server) const {
  std::string what;
  if (!tls()) {
    what =
        "plaintext (no --tls_cert/--tls_ca): anyone who can reach the ports "
        "can read and change the model; fine on a trusted network only";
  } else if (server) {
    what = ca_pem.empty() ? "TLS" : "mutual TLS (clients need a certificate)";
  } else {
    what = cert_pem.empty() ? "TLS" : "mutual TLS (with a client certificate)";
  }
  return absl::StrCat(what,
                      token.empty() ? ", no auth token" : ", bearer token");
}

std::string BearerValue(absl::string_view token) {
  return absl::StrCat("Bearer ", token);
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= a[i] ^ b[i];
  return diff == 0;
}

bool TokenMatches(absl::string_view token, absl::string_view header) {
  return ConstantTimeEquals(header, BearerValue(token));
}

}  // namespace asyncps
