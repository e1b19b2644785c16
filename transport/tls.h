// TLS for the data plane, with OpenSSL: the same certificates, CA and
// mutual authentication as the gRPC channels (rpc/grpc_credentials.h), so
// a secured cluster keeps its tensors on the fast path instead of falling
// back to gRPC. TLS 1.2 or newer, the library's default cipher suites; no
// session tickets or resumption (connections are few, pooled and
// long-lived). Writes never raise SIGPIPE. docs/SECURITY.md has the threat
// model. Thread-safe (a context serves many connections at once; each
// Stream it makes is not thread-safe).
#ifndef ASYNCPS_TRANSPORT_TLS_H_
#define ASYNCPS_TRANSPORT_TLS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/security.h"
#include "transport/stream.h"

typedef struct ssl_ctx_st SSL_CTX;

namespace asyncps {

// The subject's common name of the first certificate in `pem`
// (INVALID_ARGUMENT if it holds none): the identity a peer presenting it
// shows (Stream::PeerName).
absl::StatusOr<std::string> CertificateName(const std::string& pem);

class TlsContext {
 public:
  // A server's: its certificate (chain) and key; with a CA, a client must
  // present a certificate the CA signed (mutual TLS), as the gRPC server
  // asks. INVALID_ARGUMENT if a PEM does not parse or the key does not
  // belong to the certificate.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForServer(
      const Security& security);
  // A client's: trusts the CA (the system's roots if none) and presents its
  // own certificate if it has one. INVALID_ARGUMENT as above.
  static absl::StatusOr<std::shared_ptr<const TlsContext>> ForClient(
      const Security& security);
  ~TlsContext();
  TlsContext(const TlsContext&) = delete;
  TlsContext& operator=(const TlsContext&) = delete;

  // The server's side of a handshake on the connected, non-blocking socket
  // `fd`. UNAVAILABLE saying why (the peer does not speak TLS, presented no
  // certificate or one the CA did not sign, hung up), DEADLINE_EXCEEDED
  // once `deadline` passes.
  absl::StatusOr<std::unique_ptr<Stream>> Accept(int fd,
                                                 absl::Time deadline) const;
  // The client's side: the server's certificate must be valid and name
  // `host` (a DNS name or an IP address, as its subjectAltName lists it).
  // Errors as for Accept. With TLS 1.3 a server that refuses the client's
  // certificate says so after the handshake: the first read fails.
  absl::StatusOr<std::unique_ptr<Stream>> Connect(int fd,
                                                  const std::string& host,
                                                  absl::Time deadline) const;

 private:
  explicit TlsContext(SSL_CTX* ctx) : ctx_(ctx) {}

  SSL_CTX* const ctx_;  // Owned.
};

}  // namespace asyncps

#endif  // ASYNCPS_TRANSPORT_TLS_H_
