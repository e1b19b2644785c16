// DialDataPlane (transport/dial.h) against a stand-in shard on a real
// loopback socket (an ephemeral port), plain and TLS: a dial that presents
// the right token gets a stream that carries the next frame; a wrong token
// is refused with the shard's reason; a shard that answers the hello with a
// request, hangs up, stays silent or is not there at all is UNAVAILABLE
// with a message naming the address and what failed.
#include "transport/dial.h"

#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "proto/asyncps.pb.h"
#include "tests/testing/certs.h"
#include "transport/frame.h"
#include "transport/socket.h"
#include "transport/tls.h"

namespace asyncps::testing {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

constexpr char kToken[] = "the-shard-token";

// What the stand-in shard does once it has read a hello.
enum class Behavior {
  kCheckToken,     // As the data plane does: welcome, or refuse.
  kAnswerRequest,  // Answers with a request frame.
  kHangUp,         // Closes without an answer.
  kSilent,         // Holds the connection and says nothing.
};

// A shard's data plane reduced to its hello, on 127.0.0.1 and a port the
// kernel picks; it serves one connection, on its own thread. After a
// welcome it reads one more frame (a kJoin) and records its member.
class FakeShard {
 public:
  FakeShard(Behavior behavior, std::shared_ptr<const TlsContext> tls)
      : behavior_(behavior), tls_(std::move(tls)) {
    auto listener = ListenTcp("127.0.0.1", 0, &port_);
    EXPECT_TRUE(listener.ok()) << listener.status();
    listener_ = *std::move(listener);
    thread_ = std::thread([this] { Serve(); });
  }
  ~FakeShard() {
    ShutdownSocket(listener_.fd());
    Wait();
  }
  // Until the connection it served is over (the client closed it).
  void Wait() {
    if (thread_.joinable()) thread_.join();
  }

  DataPlaneAddress Address(const std::string& token = kToken) const {
    return {"127.0.0.1", port_, token};
  }
  // After Wait: the member its kJoin named, if any.
  const std::string& joined() const { return joined_; }

 private:
  void Serve() {
    absl::StatusOr<Socket> socket = AcceptTcp(listener_.fd());
    if (!socket.ok()) return;
    std::unique_ptr<Stream> stream;
    if (tls_ == nullptr) {
      stream = std::make_unique<TcpStream>(socket->fd());
    } else {
      absl::StatusOr<std::unique_ptr<Stream>> secured =
          tls_->Accept(socket->fd(), Soon());
      ASSERT_TRUE(secured.ok()) << secured.status();
      stream = *std::move(secured);
    }
    v1::DataHello hello;
    // Not a hello (a TLS client on a plain shard): hang up, as a shard does.
    if (!Read(stream.get(), &hello).ok()) return;
    Answer(stream.get(), hello);
    // Until the client is done: the silent shard holds the connection.
    char byte;
    stream->ReadFull(&byte, 1, Soon()).IgnoreError();
  }

  template <typename Message>
  absl::Status Read(Stream* stream, Message* m) {
    absl::StatusOr<FrameHeader> header = ReadHeader(stream, 4096, Soon());
    if (!header.ok()) return header.status();
    return ReadBody(
        stream, *header, m, [m] { return PayloadFields(m); }, Soon());
  }

  void Answer(Stream* stream, const v1::DataHello& hello) {
    FrameHeader header;
    header.op = FrameOp::kAnswer;
    switch (behavior_) {
      case Behavior::kCheckToken: {
        if (hello.token() != kToken) {
          ASSERT_TRUE(WriteError(stream,
                                 absl::PermissionDeniedError(
                                     "wrong data-plane token (the shard may "
                                     "have restarted)"),
                                 Soon())
                          .ok());
          return;
        }
        v1::DataHello welcome;
        ASSERT_TRUE(WriteFrame(stream, header, &welcome, {}, Soon()).ok());
        v1::ReplicaJoin join;
        ASSERT_TRUE(Read(stream, &join).ok());
        joined_ = join.member();
        return;
      }
      case Behavior::kAnswerRequest: {
        header.op = FrameOp::kPull;
        v1::PullRequest pull;
        ASSERT_TRUE(WriteFrame(stream, header, &pull, {}, Soon()).ok());
        return;
      }
      case Behavior::kHangUp:
        ShutdownSocket(stream->fd());
        return;
      case Behavior::kSilent:
        return;
    }
  }

  const Behavior behavior_;
  const std::shared_ptr<const TlsContext> tls_;
  int port_ = 0;
  Socket listener_;
  std::string joined_;
  std::thread thread_;
};

class DialTest : public ::testing::TestWithParam<bool> {
 protected:
  static void SetUpTestSuite() { certs_ = new std::string(MakeCerts("dial")); }
  static void TearDownTestSuite() { delete certs_; }

  bool tls() const { return GetParam(); }
  std::shared_ptr<const TlsContext> ServerTls() const {
    if (!tls()) return nullptr;
    auto c = TlsContext::ForServer(LoadCerts(*certs_, "server"));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }
  std::shared_ptr<const TlsContext> ClientTls() const {
    if (!tls()) return nullptr;
    auto c = TlsContext::ForClient(LoadCerts(*certs_, "client"));
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *c : nullptr;
  }

 private:
  static std::string* certs_;
};

std::string* DialTest::certs_ = nullptr;

void ExpectError(const absl::Status& s, absl::StatusCode code,
                 const DataPlaneAddress& address, absl::string_view says) {
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_NE(
      s.message().find(absl::StrCat("data plane at 127.0.0.1:", address.port)),
      std::string::npos)
      << s;
  EXPECT_NE(s.message().find(says), std::string::npos) << s;
}

TEST_P(DialTest, RightTokenGetsAStreamThatCarriesTheNextFrame) {
  FakeShard shard(Behavior::kCheckToken, ServerTls());
  auto c = DialDataPlane(shard.Address(), ClientTls().get(), Soon());
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(c->socket.valid());
  ASSERT_NE(c->stream, nullptr);
  EXPECT_EQ(c->stream->fd(), c->socket.fd());
  FrameHeader header;
  header.op = FrameOp::kJoin;
  v1::ReplicaJoin join;
  join.set_member("backup-1");
  ASSERT_TRUE(WriteFrame(c->stream.get(), header, &join, {}, Soon()).ok());
  c->stream.reset();  // The stand-in's last read ends.
  c->socket.Close();
  shard.Wait();
  EXPECT_EQ(shard.joined(), "backup-1");
}

TEST_P(DialTest, WrongTokenIsRefusedWithTheShardsReason) {
  FakeShard shard(Behavior::kCheckToken, ServerTls());
  const DataPlaneAddress address = shard.Address("an-old-token");
  auto c = DialDataPlane(address, ClientTls().get(), Soon());
  ASSERT_FALSE(c.ok());
  ExpectError(c.status(), absl::StatusCode::kUnavailable, address,
              "refused the connection: wrong data-plane token");
}

TEST_P(DialTest, HelloAnsweredWithARequestIsAnError) {
  FakeShard shard(Behavior::kAnswerRequest, ServerTls());
  auto c = DialDataPlane(shard.Address(), ClientTls().get(), Soon());
  ASSERT_FALSE(c.ok());
  ExpectError(c.status(), absl::StatusCode::kUnavailable, shard.Address(),
              "no welcome to the hello");
  EXPECT_NE(c.status().message().find("not an answer"), std::string::npos)
      << c.status();
}

TEST_P(DialTest, ShardThatHangsUpIsUnavailable) {
  FakeShard shard(Behavior::kHangUp, ServerTls());
  auto c = DialDataPlane(shard.Address(), ClientTls().get(), Soon());
  ASSERT_FALSE(c.ok());
  ExpectError(c.status(), absl::StatusCode::kUnavailable, shard.Address(),
              "no welcome to the hello");
}

TEST_P(DialTest, SilentShardMeetsTheDeadline) {
  FakeShard shard(Behavior::kSilent, ServerTls());
  const absl::Time start = absl::Now();
  auto c = DialDataPlane(shard.Address(), ClientTls().get(),
                         start + absl::Milliseconds(300));
  ASSERT_FALSE(c.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  ExpectError(c.status(), absl::StatusCode::kUnavailable, shard.Address(),
              "no welcome to the hello");
}

TEST_P(DialTest, NoShardListeningIsUnavailable) {
  DataPlaneAddress address;
  {
    FakeShard gone(Behavior::kSilent, nullptr);
    address = gone.Address();
  }
  auto c = DialDataPlane(address, ClientTls().get(), Soon());
  ASSERT_FALSE(c.ok());
  ExpectError(c.status(), absl::StatusCode::kUnavailable, address,
              "connect to");
}

INSTANTIATE_TEST_SUITE_P(PlainAndTls, DialTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "Tls" : "Plain";
                         });

TEST(Dial, TlsToAPlainShardSaysTls) {
  FakeShard shard(Behavior::kHangUp, nullptr);
  auto client = TlsContext::ForClient(LoadCerts(MakeCerts("dial"), "client"));
  ASSERT_TRUE(client.ok()) << client.status();
  auto c = DialDataPlane(shard.Address(), client->get(), Soon());
  ASSERT_FALSE(c.ok());
  ExpectError(c.status(), absl::StatusCode::kUnavailable, shard.Address(),
              "(TLS)");
}

TEST(Dial, AddressWithoutAPortIsAPrecondition) {
  auto c = DialDataPlane({"127.0.0.1", 0, kToken}, nullptr, Soon());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition)
      << c.status();
}

}  // namespace
}  // namespace asyncps::testing
