#include "server/replica/etcd_flags.h"

#include <string>

#include "absl/flags/flag.h"
#include "common/security.h"

ABSL_FLAG(std::string, etcd_tls_ca, "",
          "PEM CA certificate that signed etcd's: reach --etcd over TLS, "
          "checking etcd's certificate and name. Empty: plain TCP.");
ABSL_FLAG(std::string, etcd_tls_cert, "",
          "PEM client certificate to present to etcd (its "
          "--client-cert-auth); needs --etcd_tls_ca and --etcd_tls_key.");
ABSL_FLAG(std::string, etcd_tls_key, "", "PEM private key of --etcd_tls_cert.");

namespace asyncps {

absl::StatusOr<EtcdTls> EtcdTlsFromFlags() {
  EtcdTls tls;
  auto ca = ReadFlagFile("etcd_tls_ca", absl::GetFlag(FLAGS_etcd_tls_ca));
  if (!ca.ok()) return ca.status();
  auto cert = ReadFlagFile("etcd_tls_cert", absl::GetFlag(FLAGS_etcd_tls_cert));
  if (!cert.ok()) return cert.status();
  auto key = ReadFlagFile("etcd_tls_key", absl::GetFlag(FLAGS_etcd_tls_key));
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
