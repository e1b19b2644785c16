// The data plane (server/edge/data_plane.h, client/data_channel.h) against a
// real shard over loopback: it gives exactly the weights gRPC gives, with
// or without TLS, finds a restarted shard again, names the flag on a shard
// without it, and refuses a NaN gradient with the connection serving on.
// Malformed and hostile frames: data_plane_hostile_test.cc.
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/data_plane_fixture.h"
#include "tests/testing/certs.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps::testing {
namespace {

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

}  // namespace
}  // namespace asyncps::testing
