// PsExchange against two in-process shards over loopback: every exchange
// (layered, fused, prefetch) applies every gradient exactly once; fused
// leaves the worker holding what the servers hold after each step, prefetch
// one step behind (staleness 1). A shard that lost the model before Start's
// first pull gets a trained copy back when a worker holds one, else the
// model declared again. The exchange goes through the public client
// library, as ps_worker does. Shards restarted mid-step in bsp:
// ps_exchange_bsp_test.cc.
#include "worker/ps_exchange.h"

#include <algorithm>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "asyncps/client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/ps_exchange_job.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

constexpr int kSteps = 5;

class PsExchangeTest : public ::testing::TestWithParam<PsExchange::Mode> {
 protected:
  void SetUp() override {
    auto shards = StartLocalShards(2);
    ASSERT_TRUE(shards.ok()) << shards.status();
    shards_ = *std::move(shards);
    // Of 2: LostModelAtStartTest's second worker.
    auto client = Client::Connect(WorkerOptions(shards_, 0));
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

// Start on a shard that lost the model (restarted without a checkpoint)
// after the declaration. `declared` counts the fallback's calls.
class LostModelAtStartTest : public PsExchangeTest {
 protected:
  std::unique_ptr<PsExchange> Exchange(absl::Duration wait) {
    auto exchange = std::make_unique<PsExchange>(
        client_.get(), std::vector<std::vector<int>>{{1}, {0}});
    PsExchange::LostModelAtStart lost;
    lost.wait = wait;
    lost.declare = [this] {
      ++declared_;
      const std::vector<float> w(1200, kInit), b(30, kInit);
      OptimizerOptions sgd;
      sgd.kind = "sgd";
      sgd.learning_rate = kLr;
      return client_->Declare({{"w", {40, 30}}, {"b", {30}}}, {w, b}, sgd);
    };
    exchange->set_lost_model_at_start(std::move(lost));
    return exchange;
  }

  int declared_ = 0;
};

TEST_F(LostModelAtStartTest, NoWorkerHoldsACopyItIsDeclaredAgain) {
  ASSERT_TRUE(RestartLocalShard(&shards_, 1).ok());
  auto exchange = Exchange(absl::Milliseconds(100));
  std::vector<std::vector<float>> weights = {std::vector<float>(1200),
                                             std::vector<float>(30)};
  absl::Status started = exchange->Start(&weights, 0);
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(declared_, 1);
  EXPECT_EQ(weights[0], std::vector<float>(1200, kInit));
  EXPECT_EQ(weights[1], std::vector<float>(30, kInit));
}

TEST_F(LostModelAtStartTest, AWorkersTrainedCopyIsWaitedFor) {
  // Another worker holds trained weights: 7 everywhere.
  auto other = Client::Connect(WorkerOptions(shards_, 1));
  ASSERT_TRUE(other.ok()) << other.status();
  ASSERT_TRUE((*other)->Attach().ok());
  std::vector<float> trained_w(1200, 7.0f), trained_b(30, 7.0f);
  ASSERT_TRUE(RestartLocalShard(&shards_, 1).ok());
  // Its next call fails on the lost model and it recovers the shard,
  // before or while Start waits (the same end either way).
  std::thread recover([&] {
    absl::Status s = (*other)->Recover(
        absl::FailedPreconditionError("lost"),
        {absl::MakeSpan(trained_w), absl::MakeSpan(trained_b)});
    EXPECT_TRUE(s.ok()) << s;
  });
  auto exchange = Exchange(absl::Seconds(60));
  std::vector<std::vector<float>> weights = {std::vector<float>(1200),
                                             std::vector<float>(30)};
  absl::Status started = exchange->Start(&weights, 0);
  recover.join();
  ASSERT_TRUE(started.ok()) << started;
  EXPECT_EQ(declared_, 0);
  // Shard 1's slices come from the trained copy, shard 0's were never lost.
  const auto count = [&](float v) {
    return std::count(weights[0].begin(), weights[0].end(), v);
  };
  EXPECT_GT(count(7.0f), 0);
  EXPECT_GT(count(kInit), 0);
  EXPECT_EQ(count(7.0f) + count(kInit), 1200);
}

INSTANTIATE_TEST_SUITE_P(Modes, PsExchangeTest,
                         ::testing::Values(PsExchange::Mode::kLayered,
                                           PsExchange::Mode::kFused,
                                           PsExchange::Mode::kPrefetch));

}  // namespace
}  // namespace asyncps::testing
