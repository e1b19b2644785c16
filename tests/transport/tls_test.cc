// TLS on the data plane's streams (transport/tls.h) over real loopback
// sockets, with certificates from deploy/gen_certs.sh: frames cross both
// ways byte for byte; a client without a certificate or with another CA's,
// a server whose certificate does not name the host, a peer that does not
// speak TLS and one that stays silent are refused with a message saying
// why; a peer that hangs up is an error, not a SIGPIPE; bad PEMs name the
// flag.
#include "transport/tls.h"

#include <csignal>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/certs.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps::testing {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

std::shared_ptr<const TlsContext> Server(const Security& security) {
  auto tls = TlsContext::ForServer(security);
  EXPECT_TRUE(tls.ok()) << tls.status();
  return tls.ok() ? *tls : nullptr;
}

std::shared_ptr<const TlsContext> Client(const Security& security) {
  auto tls = TlsContext::ForClient(security);
  EXPECT_TRUE(tls.ok()) << tls.status();
  return tls.ok() ? *tls : nullptr;
}

// Both ends of one loopback connection, and each side's handshake (once
// Connect ran them).
struct Connection {
  Socket listener;
  Socket client_socket;
  Socket server_socket;
  absl::StatusOr<std::unique_ptr<Stream>> client = absl::UnknownError("");
  absl::StatusOr<std::unique_ptr<Stream>> server = absl::UnknownError("");
};

// A plain TCP connection over loopback, no handshake yet.
std::unique_ptr<Connection> Sockets() {
  auto c = std::make_unique<Connection>();
  int port = 0;
  auto listener = ListenTcp("127.0.0.1", 0, &port);
  EXPECT_TRUE(listener.ok()) << listener.status();
  c->listener = *std::move(listener);
  auto connected = ConnectTcp("127.0.0.1", port, Soon());
  EXPECT_TRUE(connected.ok()) << connected.status();
  c->client_socket = *std::move(connected);
  auto accepted = AcceptTcp(c->listener.fd());
  EXPECT_TRUE(accepted.ok()) << accepted.status();
  c->server_socket = *std::move(accepted);
  return c;
}

// Connects over loopback and runs both handshakes at once (the client's
// names `host`).
std::unique_ptr<Connection> Connect(const TlsContext& server,
                                    const TlsContext& client,
                                    const std::string& host = "127.0.0.1") {
  std::unique_ptr<Connection> c = Sockets();
  std::thread accept(
      [&] { c->server = server.Accept(c->server_socket.fd(), Soon()); });
  c->client = client.Connect(c->client_socket.fd(), host, Soon());
  // A client that gave up has told the server (an alert) or hung up.
  if (!c->client.ok()) ShutdownSocket(c->client_socket.fd());
  accept.join();
  return c;
}

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    certs_ = new std::string(MakeCerts("certs"));
    other_ = new std::string(MakeCerts("other"));  // Another CA.
  }
  static void TearDownTestSuite() {
    delete certs_;
    delete other_;
  }
  static const std::string& certs() { return *certs_; }
  static const std::string& other() { return *other_; }

 private:
  static std::string* certs_;
  static std::string* other_;
};

std::string* TlsTest::certs_ = nullptr;
std::string* TlsTest::other_ = nullptr;

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(n, '\0');
  for (char& b : bytes) b = static_cast<char>(random());
  return bytes;
}

TEST_F(TlsTest, FramesCrossBothWaysByteForByte) {
  auto c = Connect(*Server(LoadCerts(certs(), "server")),
                   *Client(LoadCerts(certs(), "client")));
  ASSERT_TRUE(c->client.ok()) << c->client.status();
  ASSERT_TRUE(c->server.ok()) << c->server.status();
  // Payloads of a few bytes to several megabytes: more than a TLS record
  // and more than the sockets' buffers, so both sides wait on each other.
  v1::PushRequest push;
  for (size_t n : {size_t{3}, size_t{100} << 10, size_t{5} << 20}) {
    v1::SliceData* g = push.add_gradients();
    g->mutable_key()->set_tensor("t" + std::to_string(n));
    g->set_data(RandomBytes(n, static_cast<uint32_t>(n)));
  }
  v1::PushRequest got;
  std::thread server([&] {
    Stream* s = c->server->get();
    ASSERT_TRUE(s->WaitReadable(Soon()).ok());
    auto header = ReadHeader(s, 64 << 20, Soon());
    ASSERT_TRUE(header.ok()) << header.status();
    ASSERT_TRUE(
        ReadBody(
            s, *header, &got, [&] { return PayloadFields(&got); }, Soon())
            .ok());
    // And back, as an answer.
    FrameHeader answer;
    answer.op = FrameOp::kAnswer;
    ASSERT_TRUE(WriteFrame(s, answer, &got, PayloadFields(&got), Soon()).ok());
  });
  FrameHeader h;
  h.op = FrameOp::kPush;
  ASSERT_TRUE(
      WriteFrame(c->client->get(), h, &push, PayloadFields(&push), Soon())
          .ok());
  v1::PushRequest echoed;
  auto header = ReadHeader(c->client->get(), 64 << 20, Soon());
  ASSERT_TRUE(header.ok()) << header.status();
  ASSERT_TRUE(ReadBody(
                  c->client->get(), *header, &echoed,
                  [&] { return PayloadFields(&echoed); }, Soon())
                  .ok());
  server.join();
  EXPECT_EQ(got.SerializeAsString(), push.SerializeAsString());
  EXPECT_EQ(echoed.SerializeAsString(), push.SerializeAsString());
}

TEST_F(TlsTest, ServerCertificateNamingTheHostByDnsNameIsAccepted) {
  auto c = Connect(*Server(LoadCerts(certs(), "server")),
                   *Client(LoadCerts(certs(), "client")), "localhost");
  EXPECT_TRUE(c->client.ok()) << c->client.status();
  EXPECT_TRUE(c->server.ok()) << c->server.status();
}

TEST_F(TlsTest, ServerCertificateForAnotherHostIsRefused) {
  auto c = Connect(*Server(LoadCerts(certs(), "server")),
                   *Client(LoadCerts(certs(), "client")), "shard9.example");
  ASSERT_FALSE(c->client.ok());
  EXPECT_EQ(c->client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c->client.status().message().find("hostname mismatch"),
            std::string::npos)
      << c->client.status();
  EXPECT_FALSE(c->server.ok());
}

TEST_F(TlsTest, ServerFromAnotherCaIsRefused) {
  Security trusts_other = LoadCerts(other(), "client");
  auto c =
      Connect(*Server(LoadCerts(certs(), "server")), *Client(trusts_other));
  ASSERT_FALSE(c->client.ok());
  EXPECT_NE(c->client.status().message().find("certificate is refused"),
            std::string::npos)
      << c->client.status();
  EXPECT_FALSE(c->server.ok());
}

// With TLS 1.3 the client's handshake ends before the server has judged
// its certificate: the refusal comes as the client's first read fails.
void ExpectClientRefused(Connection* c, absl::string_view server_says) {
  ASSERT_FALSE(c->server.ok());
  EXPECT_EQ(c->server.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(c->server.status().message().find(server_says), std::string::npos)
      << c->server.status();
  if (c->client.ok()) {
    char byte;
    EXPECT_EQ((*c->client)->ReadFull(&byte, 1, Soon()).code(),
              absl::StatusCode::kUnavailable);
  }
}

TEST_F(TlsTest, ClientWithoutCertificateIsRefused) {
  Security no_cert = LoadCerts(certs(), "client");
  no_cert.cert_pem.clear();
  no_cert.key_pem.clear();
  auto c = Connect(*Server(LoadCerts(certs(), "server")), *Client(no_cert));
  ExpectClientRefused(c.get(), "did not return a certificate");
}

TEST_F(TlsTest, ClientCertificateFromAnotherCaIsRefused) {
  Security other_cert = LoadCerts(certs(), "client");
  const Security other_ca = LoadCerts(other(), "client");
  other_cert.cert_pem = other_ca.cert_pem;
  other_cert.key_pem = other_ca.key_pem;
  auto c = Connect(*Server(LoadCerts(certs(), "server")), *Client(other_cert));
  ExpectClientRefused(c.get(), "certificate is refused");
}

TEST_F(TlsTest, ServerWithoutCaTakesClientsWithoutCertificates) {
  Security server = LoadCerts(certs(), "server");
  server.ca_pem.clear();  // TLS, not mutual: as gRPC's server without a CA.
  Security no_cert = LoadCerts(certs(), "client");
  no_cert.cert_pem.clear();
  no_cert.key_pem.clear();
  auto c = Connect(*Server(server), *Client(no_cert));
  EXPECT_TRUE(c->client.ok()) << c->client.status();
  EXPECT_TRUE(c->server.ok()) << c->server.status();
}

TEST_F(TlsTest, PlaintextPeerIsRefused) {
  auto server = Server(LoadCerts(certs(), "server"));
  auto c = Sockets();
  // A plaintext client's hello frame.
  TcpStream plain(c->client_socket.fd());
  v1::DataHello hello;
  hello.set_token("0123456789abcdef");
  FrameHeader h;
  h.op = FrameOp::kHello;
  ASSERT_TRUE(WriteFrame(&plain, h, &hello, {}, Soon()).ok());
  auto stream = server->Accept(c->server_socket.fd(), Soon());
  ASSERT_FALSE(stream.ok());
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(stream.status().message().find("TLS handshake"), std::string::npos)
      << stream.status();
}

TEST_F(TlsTest, SilentPeerMeetsTheDeadline) {
  auto server = Server(LoadCerts(certs(), "server"));
  auto c = Sockets();
  auto stream = server->Accept(c->server_socket.fd(),
                               absl::Now() + absl::Milliseconds(200));
  EXPECT_EQ(stream.status().code(), absl::StatusCode::kDeadlineExceeded)
      << stream.status();
}

// The regression a plain OpenSSL socket BIO would fail: write(2) on a
// connection the peer closed raises SIGPIPE, which kills the process.
TEST_F(TlsTest, PeerThatHangsUpIsAnErrorNotASignal) {
  std::signal(SIGPIPE, SIG_DFL);
  auto c = Connect(*Server(LoadCerts(certs(), "server")),
                   *Client(LoadCerts(certs(), "client")));
  ASSERT_TRUE(c->client.ok()) << c->client.status();
  ASSERT_TRUE(c->server.ok()) << c->server.status();
  *c->server = nullptr;
  c->server_socket.Close();
  const std::string big(8 << 20, 'x');
  absl::Status s;
  for (int i = 0; i < 8 && s.ok(); ++i) {
    iovec part{const_cast<char*>(big.data()), big.size()};
    s = (*c->client)->WriteFull({&part, 1}, Soon());
  }
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
}

TEST_F(TlsTest, BadPemsNameTheFlag) {
  const Security good = LoadCerts(certs(), "server");
  Security bad_cert = good;
  bad_cert.cert_pem = "not a certificate";
  Security bad_key = good;
  bad_key.key_pem = LoadCerts(other(), "server").key_pem;  // Not its key.
  Security bad_ca = good;
  bad_ca.ca_pem =
      "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
  for (const auto& [security, flag] :
       std::vector<std::pair<Security, std::string>>{{bad_cert, "--tls_cert"},
                                                     {bad_key, "--tls_key"},
                                                     {bad_ca, "--tls_ca"}}) {
    for (bool server : {true, false}) {
      auto tls = server ? TlsContext::ForServer(security)
                        : TlsContext::ForClient(security);
      ASSERT_FALSE(tls.ok()) << flag;
      EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(tls.status().message().find(flag), std::string::npos)
          << tls.status();
    }
  }
}

}  // namespace
}  // namespace asyncps::testing
