#include "server/replica/etcd_flags.h"

#include <fstream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"

ABSL_FLAG(std::string, etcd_tls_ca, "",
          "PEM CA certificate that signed etcd's: reach --etcd over TLS, "
          "checking etcd's certificate and name. Empty: plain TCP.");
ABSL_FLAG(std::string, etcd_tls_cert, "",
          "PEM client certificate to present to etcd (its "
          "--client-cert-auth); needs --etcd_tls_ca and --etcd_tls_key.");
ABSL_FLAG(std::string, etcd_tls_key, "", "PEM private key of --etcd_tls_cert.");

namespace asyncps {
namespace {

// The file's bytes; "" for no path.
absl::StatusOr<std::string> Read(const char* flag, const std::string& path) {
  if (path.empty()) return std::string();
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, "=", path, ": cannot read it, or it is empty"));
  }
  return text.str();
}

}  // namespace

absl::StatusOr<EtcdTls> EtcdTlsFromFlags() {
  EtcdTls tls;
  auto ca = Read("etcd_tls_ca", absl::GetFlag(FLAGS_etcd_tls_ca));
  if (!ca.ok()) return ca.status();
  auto cert = Read("etcd_tls_cert", absl::GetFlag(FLAGS_etcd_tls_cert));
  if (!cert.ok()) return cert.status();
  auto key = Read("etcd_tls_key", absl::GetFlag(FLAGS_etcd_tls_key));
  if (!key.ok()) return key.status();
  if (cert->empty() != key->empty()) {
    return absl::InvalidArgumentError(
        "--etcd_tls_cert and --etcd_tls_key go together: a certificate and "
        "its key");
  }
  if (ca->empty() && !cert->empty()) {
    return absl::InvalidArgumentError(
        "--etcd_tls_cert needs --etcd_tls_ca: the CA that signed etcd's "
        "certificate");
  }
  tls.ca_pem = *std::move(ca);
  tls.cert_pem = *std::move(cert);
  tls.key_pem = *std::move(key);
  return tls;
}

}  // namespace asyncps
