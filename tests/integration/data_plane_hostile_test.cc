// The data plane (server/edge/data_plane.h) against a real shard over
// loopback, meeting every malformed or hostile frame and connection flood
// with an error naming what was wrong, no weight moved, and the shard still
// serving.
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/data_plane_fixture.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps::testing {
namespace {

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
