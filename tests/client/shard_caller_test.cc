// ShardCaller against in-process shards: its options are checked, an
// unreachable shard is retried until retry_for and then named, a rank's
// registration secret is stamped on its calls (and a caller without it is
// refused), traffic is counted, and an answer that fails a call ends the
// wait for the other shards' answers.
#include "client/shard_caller.h"

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "common/clock.h"
#include "common/mode.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/integration/local_shards.h"

namespace asyncps::testing {
namespace {

PsClientOptions Options(const std::vector<ServerAddress>& servers) {
  PsClientOptions o;
  o.servers = servers;
  o.retry_for = absl::Seconds(5);
  return o;
}

// One tensor of 8 weights in two slices of 4, one on each of 2 shards.
v1::ModelSpec EightWeights() {
  v1::ModelSpec spec;
  spec.set_name("m");
  spec.set_num_shards(2);
  spec.set_slice_bytes(16);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(8);
  t->set_dtype(v1::DTYPE_F32);
  t->mutable_init()->set_kind(v1::Initializer::ZEROS);
  return spec;
}

TEST(ShardCaller, RefusesBadOptions) {
  auto none = ShardCaller::Create(PsClientOptions());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  PsClientOptions tiny = Options({{"127.0.0.1", 1}});
  tiny.max_message_bytes = kRequestOverhead;
  auto small = ShardCaller::Create(tiny);
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(small.status().message().find("max_message_bytes"),
            std::string::npos);
}

TEST(ShardCaller, GivesUpOnAnUnreachableShardAfterRetryForNamingIt) {
  // Nothing listens on port 1; the manual clock makes the backoff instant.
  ManualClock clock;
  PsClientOptions o = Options({{"127.0.0.1", 1}});
  o.retry_for = absl::Seconds(3);
  o.clock = &clock;
  auto caller = ShardCaller::Create(o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  auto stats = (*caller)->CallOne<v1::StatsResponse>(
      0, v1::StatsRequest(), ASYNCPS_RPC(Stats), "Stats");
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(stats.status().message().find("Stats to shard 0 at 127.0.0.1:1"),
            std::string::npos)
      << stats.status();
  EXPECT_NE(stats.status().message().find("giving up after 3s"),
            std::string::npos)
      << stats.status();
  EXPECT_GT((*caller)->traffic().retries, 0);
}

TEST(ShardCaller, StampsTheRanksSecretAndOthersAreRefused) {
  auto shards = StartLocalShards(2);
  ASSERT_TRUE(shards.ok()) << shards.status();
  auto worker = PsClient::Create(Options(shards->addresses));
  ASSERT_TRUE(worker.ok()) << worker.status();
  EXPECT_EQ((*worker)->rank(), -1);
  ASSERT_TRUE((*worker)->Join(0, 1).ok());
  EXPECT_EQ((*worker)->rank(), 0);
  // The declaration and pulls carry rank 0's secret, on each shard.
  const v1::ModelSpec spec = EightWeights();
  ASSERT_TRUE((*worker)->DeclareModel(spec).ok());
  std::vector<std::vector<float>> w = {std::vector<float>(8)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE((*worker)->Pull({0}, &w, &versions, 0, 0).ok());
  EXPECT_GT((*worker)->traffic().received_bytes, 0);

  // Another client acting as rank 0 without having registered: refused,
  // and not retried (it never registered, so no newer secret is coming).
  auto intruder = PsClient::Create(Options(shards->addresses));
  ASSERT_TRUE(intruder.ok());
  ASSERT_TRUE((*intruder)->UseModel(spec).ok());
  absl::Status refused = (*intruder)->Pull({0}, &w, &versions, 0, 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
}

// A bsp pull of step 1 from two shards: shard 0 holds it (no gradient for
// the step came), shard 1 refuses it at once (ABORTED: it restarted since
// the versions this worker pulled). The refusal comes back without waiting
// for shard 0, on either transport: a worker told to push again may be what
// the held pull waits for (a shard's restart mid-step in bsp).
class FailedCall : public ::testing::TestWithParam<Transport> {};

TEST_P(FailedCall, DoesNotWaitForAShardThatHoldsThePull) {
  auto shards = StartLocalShards(
      2, [](ShardServerConfig* c) { c->consistency.mode = Mode::kBsp; });
  ASSERT_TRUE(shards.ok()) << shards.status();
  PsClientOptions o = Options(shards->addresses);
  o.transport = GetParam();
  o.rpc_timeout = absl::Hours(1);  // Waiting for shard 0 would hang.
  auto worker = PsClient::Create(o);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE((*worker)->Join(0, 1).ok());
  ASSERT_TRUE((*worker)->DeclareModel(EightWeights()).ok());
  const auto& slices = (*worker)->partition().slices();
  std::vector<SliceVersion> versions(slices.size());
  bool on_both[2] = {false, false};
  for (size_t i = 0; i < slices.size(); ++i) {
    on_both[slices[i].shard] = true;
    // Shard 0's are not checked (0), shard 1's name no incarnation it had.
    if (slices[i].shard == 1) versions[i].incarnation = 12345;
  }
  ASSERT_TRUE(on_both[0] && on_both[1]);
  std::vector<std::vector<float>> w = {std::vector<float>(8)};
  absl::Status s = (*worker)->Pull({0}, &w, &versions, 0, /*clock=*/1);
  EXPECT_EQ(s.code(), absl::StatusCode::kAborted) << s;
  EXPECT_NE(s.message().find("shard 1 restarted since this worker pulled"),
            std::string::npos)
      << s;
}

// Regression (issue #38, history check seed 2 bsp/r2): a primary whose
// lease expired restarts its member and cancels the gRPC calls in flight,
// the data plane's discovery among them. The TCP path returned that
// CANCELLED to the worker, which gave up its push (its step's share lost)
// where the gRPC path retries it as the shard being away.
class CancellingServer final : public v1::ParameterServer::Service {
 public:
  grpc::Status DataPlane(grpc::ServerContext*, const v1::DataPlaneRequest*,
                         v1::DataPlaneResponse*) override {
    ++calls;
    return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
  }
  std::atomic<int> calls{0};
};

TEST(ShardCaller, RetriesADataPlaneDiscoveryTheServerCancelled) {
  CancellingServer service;
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_GT(port, 0);
  PsClientOptions o = Options({ServerAddress{"127.0.0.1", port, {}}});
  o.transport = Transport::kTcp;
  o.retry_for = absl::Milliseconds(500);
  auto caller = ShardCaller::Create(o);
  ASSERT_TRUE(caller.ok()) << caller.status();
  std::vector<ShardCall<v1::PushRequest, v1::PushResponse>> calls(1);
  absl::Status s =
      (*caller)->Exchange(&calls, FrameOp::kPush, ASYNCPS_RPC(Push), "Push",
                          /*idempotent=*/true);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("cancelled by the server"), std::string::npos)
      << s;
  EXPECT_GT(service.calls.load(), 1) << "not retried";
  server->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Transports, FailedCall,
                         ::testing::Values(Transport::kTcp, Transport::kGrpc),
                         [](const auto& info) {
                           return std::string(
                               info.param == Transport::kTcp ? "tcp" : "grpc");
                         });

}  // namespace
}  // namespace asyncps::testing
