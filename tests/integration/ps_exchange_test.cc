// PsExchange against two in-process shards over loopback: every exchange
// (layered, fused, prefetch) applies every gradient exactly once; fused
// leaves the worker holding what the servers hold after each step, prefetch
// one step behind (staleness 1). The exchange goes through the public
// client library, as ps_worker does.
#include "worker/ps_exchange.h"

#include <memory>
#include <vector>

#include "asyncps/client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

constexpr float kInit = 1.0f;
constexpr float kLr = 0.5f;
constexpr int kSteps = 5;

class PsExchangeTest : public ::testing::TestWithParam<PsExchange::Mode> {
 protected:
  void SetUp() override {
    auto shards = StartLocalShards(2);
    ASSERT_TRUE(shards.ok()) << shards.status();
    shards_ = *std::move(shards);
    ClientOptions options;
    for (const ServerAddress& a : shards_.addresses) {
      options.servers.push_back(a.ToString());
    }
    options.rank = 0;
    options.slice_bytes = 1024;
    auto client = Client::Connect(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    const std::vector<float> w(1200, kInit), b(30, kInit);
    OptimizerOptions sgd;
    sgd.kind = "sgd";
    sgd.learning_rate = kLr;
    ASSERT_TRUE(
        client_->Declare({{"w", {40, 30}}, {"b", {30}}}, {w, b}, sgd).ok());
  }

  // The servers' weights of tensor t.
  std::vector<float> ServerWeights(int t) {
    std::vector<std::vector<float>> w = {std::vector<float>(1200),
                                         std::vector<float>(30)};
    EXPECT_TRUE(
        client_->Pull({"w", "b"}, {absl::MakeSpan(w[0]), absl::MakeSpan(w[1])})
            .ok());
    return w[t];
  }

  LocalShards shards_;
  std::unique_ptr<Client> client_;
};

TEST_P(PsExchangeTest, EveryGradientIsAppliedOnce) {
  const PsExchange::Mode mode = GetParam();
  // Two layers: tensor 0, then tensor 1 (as backward produces them).
  PsExchange exchange(client_.get(), {{1}, {0}}, mode);
  std::vector<std::vector<float>> weights = {std::vector<float>(1200),
                                             std::vector<float>(30)};
  ASSERT_TRUE(exchange.Start(&weights, 0).ok());
  float applied = 0;
  int64_t staleness = 0;
  for (int step = 1; step <= kSteps; ++step) {
    const float g = 0.1f * step;
    std::vector<std::vector<float>> grads = {std::vector<float>(1200, g),
                                             std::vector<float>(30, g)};
    exchange.LayerReady(0, grads, step);
    exchange.LayerReady(1, grads, step);
    StepStats stats;
    ASSERT_TRUE(exchange.FinishStep(step, &weights, &stats).ok());
    staleness += stats.pushed.total_staleness;
    applied += g;
    if (mode != PsExchange::Mode::kPrefetch) {
      // The worker holds what the servers hold.
      EXPECT_EQ(weights[0], ServerWeights(0)) << "step " << step;
    }
  }
  ASSERT_TRUE(exchange.Finish(kSteps).ok());
  const std::vector<float> server = ServerWeights(0);
  // SGD: w = init - lr * (sum of gradients), each applied exactly once.
  float expected = kInit;
  for (int step = 1; step <= kSteps; ++step) expected -= kLr * 0.1f * step;
  for (float w : server) ASSERT_FLOAT_EQ(w, expected);
  EXPECT_EQ(weights[0], server);  // After Finish, the last answer is held.
  if (mode == PsExchange::Mode::kPrefetch) {
    EXPECT_GT(staleness, 0);  // Computed one step behind.
  } else {
    EXPECT_EQ(staleness, 0);
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, PsExchangeTest,
                         ::testing::Values(PsExchange::Mode::kLayered,
                                           PsExchange::Mode::kFused,
                                           PsExchange::Mode::kPrefetch));

}  // namespace
}  // namespace asyncps::testing
