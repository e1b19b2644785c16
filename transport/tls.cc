#include "transport/tls.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "transport/socket.h"

namespace asyncps {
namespace {

// OpenSSL's own socket BIO writes with write(2), which raises SIGPIPE on a
// connection the peer closed; this one sends with MSG_NOSIGNAL, so a
// process need not ignore SIGPIPE to survive a client that hangs up.
struct SocketBio {
  int fd;
  bool eof = false;
};

SocketBio* StateOf(BIO* b) { return static_cast<SocketBio*>(BIO_get_data(b)); }

int BioWrite(BIO* b, const char* data, size_t n, size_t* written) {
  BIO_clear_retry_flags(b);
  while (true) {
    const ssize_t w = send(StateOf(b)->fd, data, n, MSG_NOSIGNAL);
    if (w >= 0) {
      *written = static_cast<size_t>(w);
      return 1;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_write(b);
    return 0;
  }
}

int BioRead(BIO* b, char* data, size_t n, size_t* read) {
  BIO_clear_retry_flags(b);
  while (true) {
    const ssize_t r = recv(StateOf(b)->fd, data, n, 0);
    if (r > 0) {
      *read = static_cast<size_t>(r);
      return 1;
    }
    if (r == 0) {
      StateOf(b)->eof = true;
      return 0;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) BIO_set_retry_read(b);
    return 0;
  }
}

long BioCtrl(BIO* b, int cmd, long, void*) {
  switch (cmd) {
    case BIO_CTRL_FLUSH:
      return 1;
    case BIO_CTRL_EOF:
      return StateOf(b)->eof ? 1 : 0;
    default:
      return 0;
  }
}

int BioDestroy(BIO* b) {
  delete StateOf(b);
  BIO_set_data(b, nullptr);
  return 1;
}

const BIO_METHOD* SocketBioMethod() {
  static const BIO_METHOD* const method = [] {
    BIO_METHOD* m = BIO_meth_new(BIO_get_new_index() | BIO_TYPE_SOURCE_SINK,
                                 "asyncps socket");
    BIO_meth_set_write_ex(m, BioWrite);
    BIO_meth_set_read_ex(m, BioRead);
    BIO_meth_set_ctrl(m, BioCtrl);
    BIO_meth_set_destroy(m, BioDestroy);
    return m;
  }();
  return method;
}

// What OpenSSL's error queue says went wrong, or `otherwise`.
std::string OpenSslError(absl::string_view otherwise) {
  const unsigned long e = ERR_get_error();
  ERR_clear_error();
  if (e == 0) return std::string(otherwise);
  char text[256];
  ERR_error_string_n(e, text, sizeof(text));
  return text;
}

// The subject's common name of `cert` ("" if it has none).
std::string CommonName(X509* cert) {
  char name[256];
  const int n = X509_NAME_get_text_by_NID(X509_get_subject_name(cert),
                                          NID_commonName, name, sizeof(name));
  return n > 0 ? std::string(name, static_cast<size_t>(n)) : std::string();
}

// A TLS connection over a socket the caller keeps open.
class TlsStream final : public Stream {
 public:
  TlsStream(int fd, SSL* ssl) : Stream(fd), ssl_(ssl) {}
  ~TlsStream() override { SSL_free(ssl_); }

  SSL* ssl() const { return ssl_; }

  std::string PeerName() const override {
    // Verified against the CA in the handshake (a server with a CA asks
    // for a certificate and refuses one it did not sign).
    X509* cert = SSL_get0_peer_certificate(ssl_);
    return cert == nullptr ? std::string() : CommonName(cert);
  }

  absl::Status ReadFull(char* p, size_t n, absl::Time deadline) override {
    while (n > 0) {
      size_t got = 0;
      ERR_clear_error();
      const int rc = SSL_read_ex(ssl_, p, n, &got);
      if (rc == 1) {
        p += got;
        n -= got;
        continue;
      }
      RETURN_IF_ERROR(Wait(rc, "read", deadline));
    }
    return absl::OkStatus();
  }

  absl::Status WriteFull(absl::Span<const iovec> parts,
                         absl::Time deadline) override {
    // Small parts (a frame's header, meta and lengths) go out together in
    // one record instead of a record each; tensors go out as they are.
    constexpr size_t kSmall = 4 << 10;
    staged_.clear();
    for (const iovec& part : parts) {
      const char* data = static_cast<const char*>(part.iov_base);
      if (part.iov_len < kSmall) {
        staged_.append(data, part.iov_len);
        continue;
      }
      RETURN_IF_ERROR(Write(staged_.data(), staged_.size(), deadline));
      staged_.clear();
      RETURN_IF_ERROR(Write(data, part.iov_len, deadline));
    }
    return Write(staged_.data(), staged_.size(), deadline);
  }

  absl::Status WaitReadable(absl::Time deadline) override {
    // Bytes OpenSSL already took off the socket would not wake poll(2).
    if (Buffered()) return absl::OkStatus();
    return asyncps::WaitReadable(fd(), deadline);
  }

  bool Buffered() const override { return SSL_has_pending(ssl_) == 1; }

  // After an SSL call returned `rc`: waits for what it needs, or says why
  // the connection cannot go on.
  absl::Status Wait(int rc, absl::string_view what, absl::Time deadline) {
    const int error = SSL_get_error(ssl_, rc);
    switch (error) {
      case SSL_ERROR_WANT_READ:
        return asyncps::WaitReadable(fd(), deadline);
      case SSL_ERROR_WANT_WRITE:
        return WaitWritable(fd(), deadline);
      case SSL_ERROR_ZERO_RETURN:
        return absl::UnavailableError("connection closed by the peer");
      case SSL_ERROR_SYSCALL:
        return absl::UnavailableError(absl::StrCat(
            "TLS ", what, ": ",
            errno != 0 ? std::strerror(errno) : "connection lost"));
      default:
        return absl::UnavailableError(
            absl::StrCat("TLS ", what, ": ", OpenSslError("failed")));
    }
  }

 private:
  absl::Status Write(const char* p, size_t n, absl::Time deadline) {
    while (n > 0) {
      size_t wrote = 0;
      ERR_clear_error();
      const int rc = SSL_write_ex(ssl_, p, n, &wrote);
      if (rc == 1) {
        p += wrote;
        n -= wrote;
        continue;
      }
      // Retried with the same bytes, as OpenSSL requires.
      RETURN_IF_ERROR(Wait(rc, "write", deadline));
    }
    return absl::OkStatus();
  }

  SSL* const ssl_;  // Owned.
  std::string staged_;
};

struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CtxFree {
  void operator()(SSL_CTX* c) const { SSL_CTX_free(c); }
};
using CtxPtr = std::unique_ptr<SSL_CTX, CtxFree>;

// Every certificate in `pem`, in order.
absl::StatusOr<std::vector<std::unique_ptr<X509, X509Free>>> Certificates(
    const std::string& pem, absl::string_view what) {
  std::unique_ptr<BIO, BioFree> bio(
      BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
  std::vector<std::unique_ptr<X509, X509Free>> out;
  while (X509* x = PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr)) {
    out.emplace_back(x);
  }
  ERR_clear_error();  // The end of the input reads as an error.
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " holds no PEM certificate"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::string> CertificateName(const std::string& pem) {
  ASSIGN_OR_RETURN(auto chain, Certificates(pem, "the certificate"));
  return CommonName(chain[0].get());
}

namespace {

// The context's own certificate chain and key.
absl::Status UseCertificate(SSL_CTX* ctx, const Security& security) {
  ASSIGN_OR_RETURN(auto chain, Certificates(security.cert_pem, "--tls_cert"));
  if (SSL_CTX_use_certificate(ctx, chain[0].get()) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_cert: ", OpenSslError("not usable")));
  }
  for (size_t i = 1; i < chain.size(); ++i) {
    SSL_CTX_add1_chain_cert(ctx, chain[i].get());
  }
  std::unique_ptr<BIO, BioFree> bio(BIO_new_mem_buf(
      security.key_pem.data(), static_cast<int>(security.key_pem.size())));
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr || SSL_CTX_use_PrivateKey(ctx, key.get()) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key is not the private key of --tls_cert: ",
                     OpenSslError("unreadable")));
  }
  return absl::OkStatus();
}

absl::Status TrustCa(SSL_CTX* ctx, const std::string& ca_pem) {
  ASSIGN_OR_RETURN(auto cas, Certificates(ca_pem, "--tls_ca"));
  X509_STORE* store = SSL_CTX_get_cert_store(ctx);
  for (const auto& ca : cas) X509_STORE_add_cert(store, ca.get());
  return absl::OkStatus();
}

absl::StatusOr<CtxPtr> NewContext(const SSL_METHOD* method) {
  CtxPtr ctx(SSL_CTX_new(method));
  if (ctx == nullptr) {
    return absl::InternalError(
        absl::StrCat("SSL_CTX_new: ", OpenSslError("failed")));
  }
  SSL_CTX_set_min_proto_version(ctx.get(), TLS1_2_VERSION);
  // An EOF without close_notify reads as a closed connection: every frame
  // says its own length, so a truncated one is caught by its reader.
  SSL_CTX_set_options(ctx.get(), SSL_OP_IGNORE_UNEXPECTED_EOF |
                                     SSL_OP_NO_RENEGOTIATION |
                                     SSL_OP_NO_TICKET);
  SSL_CTX_set_num_tickets(ctx.get(), 0);
  SSL_CTX_set_session_cache_mode(ctx.get(), SSL_SESS_CACHE_OFF);
  SSL_CTX_set_mode(ctx.get(), SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  // Whole runs of records per recv(2) instead of two calls per record.
  SSL_CTX_set_read_ahead(ctx.get(), 1);
  SSL_CTX_set_default_read_buffer_len(ctx.get(), 256 << 10);
  return ctx;
}

bool IsIpAddress(const std::string& host) {
  unsigned char buf[sizeof(in6_addr)];
  return inet_pton(AF_INET, host.c_str(), buf) == 1 ||
         inet_pton(AF_INET6, host.c_str(), buf) == 1;
}

// Runs a handshake (`step` is SSL_accept or SSL_connect) to its end.
absl::StatusOr<std::unique_ptr<Stream>> Handshake(
    std::unique_ptr<TlsStream> stream, int (*step)(SSL*), absl::Time deadline) {
  SSL* ssl = stream->ssl();
  while (true) {
    ERR_clear_error();
    errno = 0;
    const int rc = step(ssl);
    if (rc == 1) return stream;
    const long verified = SSL_get_verify_result(ssl);
    absl::Status s = stream->Wait(rc, "handshake", deadline);
    if (s.ok()) continue;
    if (verified != X509_V_OK && s.code() == absl::StatusCode::kUnavailable) {
      return absl::UnavailableError(
          absl::StrCat("TLS handshake: the peer's certificate is refused: ",
                       X509_verify_cert_error_string(verified)));
    }
    return s;
  }
}

}  // namespace

TlsContext::~TlsContext() { SSL_CTX_free(ctx_); }

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForServer(
    const Security& security) {
  ASSIGN_OR_RETURN(CtxPtr ctx, NewContext(TLS_server_method()));
  RETURN_IF_ERROR(UseCertificate(ctx.get(), security));
  if (!security.ca_pem.empty()) {
    RETURN_IF_ERROR(TrustCa(ctx.get(), security.ca_pem));
    SSL_CTX_set_verify(
        ctx.get(), SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release()));
}

absl::StatusOr<std::shared_ptr<const TlsContext>> TlsContext::ForClient(
    const Security& security) {
  ASSIGN_OR_RETURN(CtxPtr ctx, NewContext(TLS_client_method()));
  if (!security.ca_pem.empty()) {
    RETURN_IF_ERROR(TrustCa(ctx.get(), security.ca_pem));
  } else {
    SSL_CTX_set_default_verify_paths(ctx.get());
  }
  SSL_CTX_set_verify(ctx.get(), SSL_VERIFY_PEER, nullptr);
  if (!security.cert_pem.empty()) {
    RETURN_IF_ERROR(UseCertificate(ctx.get(), security));
  }
  return std::shared_ptr<const TlsContext>(new TlsContext(ctx.release()));
}

namespace {

absl::StatusOr<std::unique_ptr<TlsStream>> NewStream(SSL_CTX* ctx, int fd) {
  SSL* ssl = SSL_new(ctx);
  if (ssl == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("SSL_new: ", OpenSslError("failed")));
  }
  auto stream = std::make_unique<TlsStream>(fd, ssl);
  BIO* bio = BIO_new(SocketBioMethod());
  if (bio == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("BIO_new: ", OpenSslError("failed")));
  }
  BIO_set_data(bio, new SocketBio{fd});
  BIO_set_init(bio, 1);
  SSL_set_bio(ssl, bio, bio);  // The SSL owns it now.
  return stream;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Stream>> TlsContext::Accept(
    int fd, absl::Time deadline) const {
  ASSIGN_OR_RETURN(std::unique_ptr<TlsStream> stream, NewStream(ctx_, fd));
  return Handshake(std::move(stream), SSL_accept, deadline);
}

absl::StatusOr<std::unique_ptr<Stream>> TlsContext::Connect(
    int fd, const std::string& host, absl::Time deadline) const {
  ASSIGN_OR_RETURN(std::unique_ptr<TlsStream> stream, NewStream(ctx_, fd));
  SSL* ssl = stream->ssl();
  if (IsIpAddress(host)) {
    X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), host.c_str());
  } else {
    SSL_set_tlsext_host_name(ssl, host.c_str());
    SSL_set1_host(ssl, host.c_str());
  }
  return Handshake(std::move(stream), SSL_connect, deadline);
}

}  // namespace asyncps
