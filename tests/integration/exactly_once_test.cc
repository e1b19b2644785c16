// Exactly-once pushes through real sockets: two in-process shards that
// apply every third push and then answer it UNAVAILABLE, as if the answer
// were lost on the way. PsClient retries each such push, and the shards
// answer the retry from their ledger: the weights are exactly the sum of
// the gradients sent once each, on both transports, for Push and PushPull.
#include <memory>
#include <string>
#include <vector>

#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

struct Case {
  Transport transport;
  bool fused;
};

class ExactlyOnceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ExactlyOnceTest, LostAnswersDoNotApplyAPushTwice) {
  auto shards = StartLocalShards(2, [](ShardServerConfig* c) {
    c->consistency.lose_every_nth_answer = 3;
  });
  ASSERT_TRUE(shards.ok()) << shards.status();
  PsClientOptions options;
  options.servers = shards->addresses;
  options.transport = GetParam().transport;
  options.backoff_initial = absl::Milliseconds(1);
  auto client = PsClient::Create(options);
  ASSERT_TRUE(client.ok());
  // Weights 0, SGD with learning rate 1: after n pushes of gradient 1 every
  // weight is exactly -n (small integers are exact in f32).
  const v1::ModelSpec spec =
      ConstantSpec({{300, 10}, {10}}, 2, 0.0f, 1.0f, 1024);
  ASSERT_TRUE((*client)->Join(0, 1).ok());
  ASSERT_TRUE((*client)->DeclareModel(spec).ok());
  const std::vector<int> tensors = {0, 1};
  std::vector<std::vector<float>> w = {std::vector<float>(3000),
                                       std::vector<float>(10)};
  std::vector<std::vector<float>> g = {std::vector<float>(3000, 1.0f),
                                       std::vector<float>(10, 1.0f)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE((*client)->Pull(tensors, &w, &versions, 0, 0).ok());
  constexpr int kPushes = 30;
  for (int i = 1; i <= kPushes; ++i) {
    PushStats r;
    if (GetParam().fused) {
      ASSERT_TRUE((*client)
                      ->PushPull(tensors, g, versions, 0, i, &w, &versions, &r)
                      .ok());
    } else {
      ASSERT_TRUE((*client)->Push(tensors, g, versions, 0, i, &r).ok());
      ASSERT_TRUE((*client)->Pull(tensors, &w, &versions, 0, i).ok());
    }
    EXPECT_EQ(r.dropped, 0);
  }
  for (const auto& t : w) {
    for (float x : t) ASSERT_EQ(x, -static_cast<float>(kPushes));
  }
  for (const SliceVersion& v : versions) EXPECT_EQ(v.version, kPushes);
  auto stats = AdminClient((*client)->caller()).StatsAll();
  ASSERT_TRUE(stats.ok());
  for (const auto& s : *stats) {
    // Every third push to each shard lost its answer and came again. A
    // PushPull's attempt also ends at the other shard's lost answer
    // (ShardCaller::MayHold), and its push comes again here too if this
    // shard's answer had not been read yet: at most once more each.
    EXPECT_GE(s.duplicate_pushes(), kPushes / 3) << "shard " << s.shard();
    EXPECT_LE(s.duplicate_pushes(), 2 * (kPushes / 3)) << "shard " << s.shard();
    if (!GetParam().fused) {
      EXPECT_EQ(s.duplicate_pushes(), kPushes / 3) << "shard " << s.shard();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, ExactlyOnceTest,
                         ::testing::Values(Case{Transport::kTcp, false},
                                           Case{Transport::kTcp, true},
                                           Case{Transport::kGrpc, false},
                                           Case{Transport::kGrpc, true}));

}  // namespace
}  // namespace asyncps::testing
