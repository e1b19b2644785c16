// The data plane (server/edge/data_plane.h, client/data_channel.h) against a
// real shard over loopback: it gives exactly the weights gRPC gives, finds a
// restarted shard again, and meets every malformed or hostile frame with an
// error naming what was wrong, no weight moved, and the shard still serving.
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"
#include "tests/testing/certs.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps::testing {
namespace {

absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// A header's 32 bytes, written by hand so that tests can break any field.
std::string Header(uint32_t magic, uint8_t version, uint8_t op, uint32_t meta,
                   uint32_t payloads, uint64_t payload_bytes) {
  std::string h(kFrameHeaderBytes, '\0');
  std::memcpy(&h[0], &magic, 4);
  h[4] = static_cast<char>(version);
  h[5] = static_cast<char>(op);
  std::memcpy(&h[8], &meta, 4);
  std::memcpy(&h[12], &payloads, 4);
  std::memcpy(&h[16], &payload_bytes, 8);
  return h;
}

// A frame written on the plain socket `fd`.
absl::Status Send(int fd, FrameHeader h, google::protobuf::MessageLite* meta,
                  const std::vector<std::string*>& payloads = {}) {
  TcpStream stream(fd);
  return WriteFrame(&stream, h, meta, payloads, Soon());
}

std::string Op(FrameOp op, uint32_t meta, uint32_t payloads = 0,
               uint64_t payload_bytes = 0) {
  return Header(kFrameMagic, kFrameVersion, static_cast<uint8_t>(op), meta,
                payloads, payload_bytes);
}

// A gradient push of `values` (12 of them) for tensor t0's one slice.
// A push of `values` as rank 0 holding `secret`.
v1::PushRequest PushOf(const std::vector<float>& values, uint64_t secret) {
  v1::PushRequest push;
  push.set_secret(secret);
  v1::SliceData* g = push.add_gradients();
  g->mutable_key()->set_tensor("t0");
  g->mutable_key()->set_count(values.size());
  g->set_dtype(v1::DTYPE_F32);
  g->set_data(std::string(reinterpret_cast<const char*>(values.data()),
                          values.size() * sizeof(float)));
  return push;
}

// Bytes a client sends, and what the refusal must say.
struct Refusal {
  std::string bytes;
  std::string says;
};

class DataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(ShardServerConfig()); }

  void Start(ShardServerConfig config) {
    config.host = "127.0.0.1";
    config.security = server_security_;
    auto server = ShardServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    next_rank_ = 0;
    grpc_ = Client(Transport::kGrpc);  // Rank 0.
    ASSERT_TRUE(grpc_->DeclareModel(spec_).ok());
    v1::RegisterRequest again;  // Rank 0 again, for raw frames' secret.
    again.set_rank(0);
    again.set_num_workers(kJobSize);
    auto joined = grpc_->caller()->Register(0, again);
    ASSERT_TRUE(joined.ok()) << joined.status();
    secret_ = joined->secret();
  }

  std::unique_ptr<PsClient> Client(Transport transport,
                                   v1::DType dtype = v1::DTYPE_F32) {
    PsClientOptions options;
    options.servers = {ServerAddress{"127.0.0.1", server_->port()}};
    options.transport = transport;
    options.wire_dtype = dtype;
    options.security = client_security_;
    options.retry_for = absl::Seconds(10);
    options.backoff_initial = absl::Milliseconds(5);
    auto client = PsClient::Create(options);
    EXPECT_TRUE(client.ok());
    EXPECT_TRUE((*client)->UseModel(spec_).ok());
    // Each client is a worker of its own rank.
    EXPECT_TRUE((*client)->Join(next_rank_++, kJobSize).ok());
    return *std::move(client);
  }

  std::vector<float> Weights() {
    std::vector<std::vector<float>> w = {std::vector<float>(12)};
    std::vector<SliceVersion> versions;
    EXPECT_TRUE(grpc_->Pull({0}, &w, &versions, -1, 0).ok());
    return w[0];
  }

  // A connection that has presented the right token.
  Socket Welcomed() {
    auto s = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
    EXPECT_TRUE(s.ok()) << s.status();
    v1::DataHello hello;
    hello.set_token(Token());
    FrameHeader h;
    h.op = FrameOp::kHello;
    EXPECT_TRUE(Send(s->fd(), h, &hello).ok());
    EXPECT_TRUE(Answer(s->fd()).ok());
    return *std::move(s);
  }

  std::string Token() { return server_->data_token(); }

  // Reads one answer: its status (OK: an empty-bodied answer was skipped).
  absl::Status Answer(int fd) {
    TcpStream stream(fd);
    auto h = ReadHeader(&stream, 1 << 20, Soon());
    if (!h.ok()) return h.status();
    if (h->code != 0) {
      absl::Status answer;
      absl::Status read = ReadError(&stream, *h, Soon(), &answer);
      return read.ok() ? answer : read;
    }
    return SkipBytes(&stream, h->BodyBytes(), Soon());
  }

  // Sends `bytes`, reads the answer, and checks that the server then
  // closed the connection.
  absl::Status SendAndExpectClose(Socket s, const std::string& bytes) {
    iovec part{const_cast<char*>(bytes.data()), bytes.size()};
    EXPECT_TRUE(WriteFull(s.fd(), {&part, 1}, Soon()).ok());
    absl::Status answer = Answer(s.fd());
    char c;
    EXPECT_EQ(ReadFull(s.fd(), &c, 1, Soon()).code(),
              absl::StatusCode::kUnavailable)
        << "the connection should be closed";
    return answer;
  }

  // Each of `cases`, sent on a welcomed connection, is answered `code`
  // with a message saying what it must, and closes the connection; then
  // the shard still serves, no weight moved.
  void ExpectRefused(const std::vector<Refusal>& cases, absl::StatusCode code) {
    for (const Refusal& c : cases) {
      absl::Status a = SendAndExpectClose(Welcomed(), c.bytes);
      EXPECT_EQ(a.code(), code) << c.says;
      EXPECT_NE(a.message().find(c.says), std::string::npos) << a;
    }
    ExpectServing();
  }

  void ExpectServing() {
    auto client = Client(Transport::kTcp);
    std::vector<std::vector<float>> w = {std::vector<float>(12)};
    std::vector<SliceVersion> versions;
    EXPECT_TRUE(client->Pull({0}, &w, &versions, -1, 0).ok());
    EXPECT_EQ(Weights(), std::vector<float>(12, 1.0f)) << "a weight moved";
  }

  const v1::ModelSpec spec_ = ConstantSpec({{4, 3}}, 1, 1.0f, 0.5f, 1024);
  // Empty: plaintext.
  Security server_security_;
  Security client_security_;
  std::unique_ptr<ShardServer> server_;
  std::unique_ptr<PsClient> grpc_;
  static constexpr int kJobSize = 64;
  int next_rank_ = 0;
  uint64_t secret_ = 0;  // Rank 0's, for requests written by hand.
};

// Three rounds of Push, Pull and PushPull through `client`.
std::vector<float> Train(PsClient* client) {
  std::vector<std::vector<float>> w = {std::vector<float>(12)};
  std::vector<SliceVersion> versions;
  const int rank = client->rank();
  EXPECT_TRUE(client->Pull({0}, &w, &versions, rank, 0).ok());
  for (int round = 1; round <= 3; ++round) {
    std::vector<std::vector<float>> g = {std::vector<float>(12)};
    for (int i = 0; i < 12; ++i) g[0][i] = 0.37f * i - round;
    PushStats r;
    EXPECT_TRUE(client->Push({0}, g, versions, rank, round, &r).ok());
    EXPECT_TRUE(client->Pull({0}, &w, &versions, rank, round).ok());
    EXPECT_TRUE(
        client->PushPull({0}, g, versions, rank, round, &w, &versions, &r)
            .ok());
    EXPECT_EQ(r.slices, 1);
  }
  return w[0];
}

TEST_F(DataPlaneTest, GivesExactlyTheWeightsGrpcGives) {
  for (v1::DType dtype : {v1::DTYPE_F32, v1::DTYPE_BF16, v1::DTYPE_F16}) {
    Start(ShardServerConfig());
    std::vector<float> over_grpc = Train(Client(Transport::kGrpc, dtype).get());
    Start(ShardServerConfig());
    std::vector<float> over_tcp = Train(Client(Transport::kTcp, dtype).get());
    EXPECT_EQ(over_tcp, over_grpc) << v1::DType_Name(dtype);
    EXPECT_NE(over_tcp[5], 1.0f);
  }
}

// The same shard with mutual TLS: its data plane takes the gRPC port's
// certificate, key and CA.
class TlsDataPlaneTest : public DataPlaneTest {
 protected:
  void SetUp() override {
    const std::string certs = MakeCerts("certs");
    server_security_ = LoadCerts(certs, "server");
    client_security_ = LoadCerts(certs, "client");
    DataPlaneTest::SetUp();
  }
};

TEST_F(TlsDataPlaneTest, GivesExactlyTheWeightsGrpcGives) {
  Start(ShardServerConfig());
  std::vector<float> over_grpc = Train(Client(Transport::kGrpc).get());
  Start(ShardServerConfig());
  EXPECT_NE(server_->data_port(), 0) << "no data plane with TLS";
  std::vector<float> over_tcp = Train(Client(Transport::kTcp).get());
  EXPECT_EQ(over_tcp, over_grpc);
  EXPECT_NE(over_tcp[5], 1.0f);
}

// A plaintext peer that somehow has the port and the token (from the
// DataPlane RPC) gets no further than the handshake: nothing moves.
TEST_F(TlsDataPlaneTest, PlaintextConnectionIsRefusedAndNothingMoves) {
  auto s = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
  ASSERT_TRUE(s.ok()) << s.status();
  v1::DataHello hello;
  hello.set_token(Token());
  FrameHeader h;
  h.op = FrameOp::kHello;
  ASSERT_TRUE(Send(s->fd(), h, &hello).ok());
  v1::PushRequest push = PushOf(std::vector<float>(12, 9.0f), secret_);
  h.op = FrameOp::kPush;
  Send(s->fd(), h, &push, PayloadFields(&push)).IgnoreError();
  EXPECT_EQ(Answer(s->fd()).code(), absl::StatusCode::kUnavailable)
      << "the shard should close the connection unanswered";
  ExpectServing();
}

TEST_F(DataPlaneTest, FindsARestartedShardAgain) {
  auto client = Client(Transport::kTcp);
  EXPECT_EQ(Train(client.get()).size(), 12u);
  const int port = server_->port();
  server_->Shutdown();
  ShardServerConfig config;
  config.port = port;  // The same gRPC address; a new data port and token.
  Start(config);
  EXPECT_NE(server_->data_port(), 0);
  std::vector<std::vector<float>> w = {std::vector<float>(12)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(client->Pull({0}, &w, &versions, -1, 0).ok());
  EXPECT_EQ(w[0], std::vector<float>(12, 1.0f));  // The fresh model.
  EXPECT_NE(server_->data_token(), "");
}

TEST_F(DataPlaneTest, ShardWithoutDataPlaneNamesTheFlag) {
  ShardServerConfig config;
  config.data_port = -1;
  Start(config);
  EXPECT_EQ(server_->data_port(), 0);
  auto client = Client(Transport::kTcp);
  std::vector<std::vector<float>> w = {std::vector<float>(12)};
  std::vector<SliceVersion> versions;
  absl::Status s = client->Pull({0}, &w, &versions, -1, 0);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--transport=grpc"), std::string::npos) << s;
}

TEST_F(DataPlaneTest, NanGradientIsRefusedAndTheConnectionServesOn) {
  Socket s = Welcomed();
  std::vector<float> values(12, 0.5f);
  values[7] = std::nanf("");
  v1::PushRequest push = PushOf(values, secret_);
  FrameHeader h;
  h.op = FrameOp::kPush;
  ASSERT_TRUE(Send(s.fd(), h, &push, PayloadFields(&push)).ok());
  absl::Status answer = Answer(s.fd());
  EXPECT_EQ(answer.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(answer.message().find("NaN at element 7"), std::string::npos)
      << answer;
  // The same connection still answers a pull.
  v1::PullRequest pull;
  *pull.add_slices() = push.gradients(0).key();
  pull.set_rank(-1);
  h.op = FrameOp::kPull;
  ASSERT_TRUE(Send(s.fd(), h, &pull).ok());
  EXPECT_TRUE(Answer(s.fd()).ok());
  ExpectServing();
}

TEST_F(DataPlaneTest, RequestBeforeHelloIsDenied) {
  auto s = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
  ASSERT_TRUE(s.ok());
  absl::Status a = SendAndExpectClose(*std::move(s), Op(FrameOp::kPull, 0));
  EXPECT_EQ(a.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(a.message().find("hello"), std::string::npos) << a;
  ExpectServing();
}

TEST_F(DataPlaneTest, WrongTokenIsDenied) {
  auto s = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
  ASSERT_TRUE(s.ok());
  v1::DataHello hello;
  hello.set_token("not-the-token");
  const std::string meta = hello.SerializeAsString();
  absl::Status a = SendAndExpectClose(*std::move(s),
                                      Op(FrameOp::kHello, meta.size()) + meta);
  EXPECT_EQ(a.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(a.message().find("wrong data-plane token"), std::string::npos) << a;
  ExpectServing();
}

TEST_F(DataPlaneTest, BadMagicVersionOrOpClosesTheConnection) {
  ExpectRefused(
      {
          {Header(0x48545450, kFrameVersion, 3, 0, 0, 0), "bad magic"},
          {Header(kFrameMagic, 9, 3, 0, 0, 0), "version 9"},
          {Header(kFrameMagic, kFrameVersion, 77, 0, 0, 0),
           "unknown data-plane op"},
          {Op(FrameOp::kAnswer, 0), "is not a request"},
          {Op(FrameOp::kHello, 0), "is not a request"},
      },
      absl::StatusCode::kInvalidArgument);
}

// The frames between a replicated shard's members (server/replication.h):
// a join on a shard of one process, or an op sent to a shard, is refused,
// the connection closed, and no weight moves.
TEST_F(DataPlaneTest, ReplicationFramesOnAShardOfOneAreRefused) {
  v1::ReplicaJoin join;
  join.set_epoch(1);
  join.set_member("127.0.0.1:1");
  const std::string meta = join.SerializeAsString();
  ExpectRefused({{Op(FrameOp::kJoin, meta.size()) + meta, "not replicated"}},
                absl::StatusCode::kFailedPrecondition);
  ExpectRefused({{Op(FrameOp::kReplicate, 0), "is not a request"}},
                absl::StatusCode::kInvalidArgument);
}

TEST_F(DataPlaneTest, HugeFrameIsRefusedBeforeAnythingIsAllocated) {
  ExpectRefused(
      {
          {Op(FrameOp::kPush, 10, 1, uint64_t{1} << 62), "exceeds the limit"},
          {Op(FrameOp::kPush, 10, 0xffffffff, 0), "exceeds the limit"},
          {Op(FrameOp::kPush, 10, 1, ~uint64_t{0}), "exceeds the limit"},
      },
      absl::StatusCode::kResourceExhausted);
}

TEST_F(DataPlaneTest, PayloadsThatDoNotMatchTheMetaAreRefused) {
  v1::PushRequest push = PushOf(std::vector<float>(12, 0.5f), secret_);
  push.mutable_gradients(0)->clear_data();
  const std::string meta = push.SerializeAsString();
  auto length = [](uint64_t n) {
    return std::string(reinterpret_cast<const char*>(&n), sizeof(n));
  };
  ExpectRefused(
      {
          // Two payloads announced, one tensor in the meta.
          {Op(FrameOp::kPush, meta.size(), 2, 96) + meta + length(48) +
               length(48) + std::string(96, '\0'),
           "announces 2 payloads"},
          // Lengths that do not add up to the announced total.
          {Op(FrameOp::kPush, meta.size(), 1, 48) + meta + length(40) +
               std::string(48, '\0'),
           "do not add up"},
          // A meta that is not a PushRequest.
          {Op(FrameOp::kPush, 3, 0, 0) + "\xff\xff\xff", "does not parse"},
      },
      absl::StatusCode::kInvalidArgument);
}

TEST_F(DataPlaneTest, TruncatedFrameLeavesTheShardServing) {
  Socket s = Welcomed();
  const std::string partial = Op(FrameOp::kPush, 100, 1, 48).substr(0, 20);
  iovec part{const_cast<char*>(partial.data()), partial.size()};
  ASSERT_TRUE(WriteFull(s.fd(), {&part, 1}, Soon()).ok());
  s.Close();  // The client dies mid-frame.
  ExpectServing();
}

TEST_F(DataPlaneTest, ConnectionsBeyondTheLimitAreRefused) {
  ShardServerConfig config;
  config.max_data_connections = 1;
  Start(config);
  Socket first = Welcomed();
  auto second = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
  ASSERT_TRUE(second.ok());
  absl::Status a = Answer(second->fd());
  EXPECT_EQ(a.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a.message().find("at most 1 data-plane connections"),
            std::string::npos)
      << a;
}

// One client address may hold only so many of the shard's connections
// (a client that opens them and says nothing cannot take them all); one
// that closes makes room again.
TEST_F(DataPlaneTest, ConnectionsFromOneAddressAreBounded) {
  ShardServerConfig config;
  config.max_data_connections_per_client = 2;
  Start(config);
  Socket first = Welcomed();
  auto silent = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
  ASSERT_TRUE(silent.ok());
  auto third = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
  ASSERT_TRUE(third.ok());
  absl::Status a = Answer(third->fd());
  EXPECT_EQ(a.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a.message().find("2 data-plane connections from one address "
                             "(127.0.0.1)"),
            std::string::npos)
      << a;
  *silent = Socket();  // Closed: the shard's thread for it ends.
  // The next connection is served once the shard has seen the close.
  absl::Status welcomed;
  for (int i = 0; i < 200; ++i) {
    auto again = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
    ASSERT_TRUE(again.ok());
    v1::DataHello hello;
    hello.set_token(Token());
    FrameHeader h;
    h.op = FrameOp::kHello;
    ASSERT_TRUE(Send(again->fd(), h, &hello).ok());
    welcomed = Answer(again->fd());
    if (welcomed.ok()) break;
    ASSERT_EQ(welcomed.code(), absl::StatusCode::kResourceExhausted);
    absl::SleepFor(absl::Milliseconds(10));  // Not synchronisation: a retry.
  }
  EXPECT_TRUE(welcomed.ok()) << welcomed;
}

}  // namespace
}  // namespace asyncps::testing
