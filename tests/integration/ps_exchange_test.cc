// PsExchange against two in-process shards over loopback: every exchange
// (layered, fused, prefetch) applies every gradient exactly once; fused
// leaves the worker holding what the servers hold after each step, prefetch
// one step behind (staleness 1). A shard that lost the model before Start's
// first pull gets a trained copy back when a worker holds one, else the
// model declared again. In bsp, a shard restored from an older checkpoint
// mid-step does not strand a worker waiting for a layer the other worker
// had already finished. The exchange goes through the public client
// library, as ps_worker does.
#include "worker/ps_exchange.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "asyncps/client.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

constexpr float kInit = 1.0f;
constexpr float kLr = 0.5f;
constexpr int kSteps = 5;

// Worker `rank` of a job of 2 on `shards`, with slices of 1 KiB.
ClientOptions WorkerOptions(const LocalShards& shards, int rank) {
  ClientOptions options;
  for (const ServerAddress& a : shards.addresses) {
    options.servers.push_back(a.ToString());
  }
  options.rank = rank;
  options.num_workers = 2;
  options.slice_bytes = 1024;
  return options;
}

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

// bsp with two workers and two layers (b, then w), both spread over both
// shards; shards checkpoint on request and never heal a step (a heal would
// hide the stall this is about).
class BspShardRestartTest : public ::testing::Test {
 protected:
  void SetUp() override {
    tweak_ = [this](ShardServerConfig* c) {
      c->consistency.mode = Mode::kBsp;
      c->consistency.heal_after = absl::ZeroDuration();
      c->checkpoint_dir = dir_;
      c->checkpoint_every = absl::ZeroDuration();
    };
    auto shards = StartLocalShards(2, tweak_);
    ASSERT_TRUE(shards.ok()) << shards.status();
    shards_ = *std::move(shards);
    PsClientOptions admin;
    admin.servers = shards_.addresses;
    auto ps = PsClient::Create(admin);
    ASSERT_TRUE(ps.ok()) << ps.status();
    admin_ = *std::move(ps);
  }

  // A worker that gives up on a call within 10 s.
  std::unique_ptr<Client> Connect(int rank) {
    ClientOptions options = WorkerOptions(shards_, rank);
    options.mode = "bsp";
    options.rpc_timeout_seconds = 3;
    options.retry_for_seconds = 10;
    auto client = Client::Connect(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  // Polls shard `shard`'s stats until `done` holds (at most 30 s).
  template <typename Done>
  bool WaitForStats(int shard, Done done) {
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (absl::Now() < give_up) {
      auto stats = AdminClient(admin_->caller()).Stats(shard);
      if (stats.ok() && done(*stats)) return true;
      absl::SleepFor(absl::Milliseconds(5));
    }
    return false;
  }

  std::string dir_ = FreshTempDir("bsp-restart");
  std::function<void(ShardServerConfig*)> tweak_;
  LocalShards shards_;
  std::unique_ptr<PsClient> admin_;
};

// Rank 1 (a PsExchange) pulled layer b of step 2 from shard 1 and waits for
// w; rank 0 (calls by hand) pushed b and has not pulled it. Shard 1 comes
// back from its checkpoint of step 1, without either's b. Rank 1, told to
// push again, sends b as well as w, and rank 0's pull of b then completes:
// both finish the step, with every gradient applied once.
TEST_F(BspShardRestartTest, AWorkerPastALayerPushesItAgainForTheOther) {
  auto rank0 = Connect(0);
  auto rank1 = Connect(1);
  ASSERT_TRUE(rank0 != nullptr && rank1 != nullptr);
  OptimizerOptions sgd;
  sgd.kind = "sgd";
  sgd.learning_rate = kLr;
  ASSERT_TRUE(rank0
                  ->Declare({{"w", {40, 30}}, {"b", {600}}},
                            {std::vector<float>(1200, kInit),
                             std::vector<float>(600, kInit)},
                            sgd)
                  .ok());
  ASSERT_TRUE(rank1->Attach().ok());
  PsExchange exchange(rank1.get(), {{1}, {0}}, PsExchange::Mode::kLayered,
                      /*steps=*/true);
  std::vector<std::vector<float>> weights1 = {std::vector<float>(1200),
                                              std::vector<float>(600)};
  ASSERT_TRUE(exchange.Start(&weights1, 0).ok());

  // Rank 0's side of a layer, as PsExchange does it.
  auto b = rank0->Resolve({"b"});
  auto w = rank0->Resolve({"w"});
  ASSERT_TRUE(b.ok() && w.ok());
  std::vector<float> w0(1200), b0(600);
  Snapshot held;
  CallOptions start;
  start.step = 0;
  start.into = &held;
  ASSERT_TRUE(
      rank0->Pull({"w", "b"}, {absl::MakeSpan(w0), absl::MakeSpan(b0)}, start)
          .ok());
  // Layer `is_b` (b, else w).
  auto push = [&](bool is_b, float g, int64_t step, bool again) {
    const TensorSet& set = is_b ? *b : *w;
    const std::vector<float> grad(is_b ? 600 : 1200, g);
    CallOptions o;
    o.step = step;
    o.from = &held;
    o.again = again;
    return rank0->Push(set, {absl::MakeConstSpan(grad)}, o);
  };
  auto pull = [&](bool is_b, float g, int64_t step) {
    const TensorSet& set = is_b ? *b : *w;
    CallOptions o;
    o.step = step;
    o.into = &held;
    o.after_push = true;
    std::vector<absl::Span<float>> out = {is_b ? absl::MakeSpan(b0)
                                               : absl::MakeSpan(w0)};
    absl::Status s = rank0->Pull(set, out, o);
    if (s.code() == absl::StatusCode::kAborted) {
      EXPECT_TRUE(push(is_b, g, step, /*again=*/true).ok());
      o.any_incarnation = true;
      s = rank0->Pull(set, out, o);
    }
    return s;
  };
  auto rank1_step = [&](float g, int64_t step, absl::Status* s) {
    const std::vector<std::vector<float>> grads = {std::vector<float>(1200, g),
                                                   std::vector<float>(600, g)};
    exchange.LayerReady(0, grads, step);
    exchange.LayerReady(1, grads, step);
    StepStats stats;
    *s = exchange.FinishStep(step, &weights1, &stats);
  };

  // Step 1, undisturbed; then both shards checkpoint it.
  absl::Status step1_done;
  std::thread one([&] { rank1_step(0.1f, 1, &step1_done); });
  ASSERT_TRUE(push(true, 0.1f, 1, false).ok());
  ASSERT_TRUE(pull(true, 0.1f, 1).ok());
  ASSERT_TRUE(push(false, 0.1f, 1, false).ok());
  ASSERT_TRUE(pull(false, 0.1f, 1).ok());
  one.join();
  ASSERT_TRUE(step1_done.ok()) << step1_done;
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(AdminClient(admin_->caller()).Checkpoint(shard).ok());
  }
  // Kept aside: an in-process shutdown writes a last checkpoint, which a
  // SIGKILLed shard would not have.
  const std::string step1 = FreshTempDir("bsp-restart-step1");
  std::filesystem::copy(dir_, step1,
                        std::filesystem::copy_options::recursive |
                            std::filesystem::copy_options::overwrite_existing);

  // Step 2: rank 0 pushes b; rank 1 gets b's step and waits in w's pull
  // (held on shard 0 too, which says it has come that far).
  ASSERT_TRUE(push(true, 0.2f, 2, false).ok());
  auto before = AdminClient(admin_->caller()).Stats(0);
  ASSERT_TRUE(before.ok()) << before.status();
  absl::Status step2;
  std::thread two([&] { rank1_step(0.2f, 2, &step2); });
  ASSERT_TRUE(WaitForStats(0, [&](const v1::StatsResponse& now) {
    return now.held_pulls() > before->held_pulls();
  }));
  ASSERT_TRUE(RestartLocalShard(&shards_, 1, [&](ShardServerConfig* c) {
                tweak_(c);
                c->checkpoint_dir = step1;
              }).ok());
  // Both workers' heartbeats reach the restarted shard: from then on its
  // steps wait for both (before, for those live there).
  ASSERT_TRUE(WaitForStats(
      1, [](const v1::StatsResponse& now) { return now.live_workers() == 2; }));
  const absl::Status pulled_b = pull(true, 0.2f, 2);
  EXPECT_TRUE(pulled_b.ok()) << pulled_b;
  if (pulled_b.ok()) {
    ASSERT_TRUE(push(false, 0.2f, 2, false).ok());
    const absl::Status pulled_w = pull(false, 0.2f, 2);
    EXPECT_TRUE(pulled_w.ok()) << pulled_w;
  }
  two.join();
  ASSERT_TRUE(step2.ok()) << step2;
  // SGD over two steps whose two gradients were equal: init - lr * (0.1 +
  // 0.2) everywhere, on both workers.
  const float expected = kInit - kLr * (0.1f + 0.2f);
  for (float v : weights1[0]) ASSERT_FLOAT_EQ(v, expected);
  for (float v : weights1[1]) ASSERT_FLOAT_EQ(v, expected);
  EXPECT_EQ(w0, weights1[0]);
  EXPECT_EQ(b0, weights1[1]);
}

// Regression (issue #38, 7): after a shard lost the model mid-step and was
// restored from a worker's copy, the layered exchange pushed the step's
// gradient again but the fused one did not: its step waited on the
// restored shard for a gradient nobody sent (or skipped it). Both ranks
// here are exchanges of the mode under test; rank 1's step-2 call is held
// on shard 1 when shard 1 restarts without a checkpoint. Every gradient
// must be applied once: init - lr * (0.1 + 0.2) everywhere.
class BspRecoverStepTest
    : public BspShardRestartTest,
      public ::testing::WithParamInterface<PsExchange::Mode> {};

TEST_P(BspRecoverStepTest, AStepBrokenOffByALostModelIsPushedAgain) {
  std::unique_ptr<Client> ranks[2] = {Connect(0), Connect(1)};
  ASSERT_TRUE(ranks[0] != nullptr && ranks[1] != nullptr);
  OptimizerOptions sgd;
  sgd.kind = "sgd";
  sgd.learning_rate = kLr;
  ASSERT_TRUE(ranks[0]
                  ->Declare({{"w", {40, 30}}, {"b", {600}}},
                            {std::vector<float>(1200, kInit),
                             std::vector<float>(600, kInit)},
                            sgd)
                  .ok());
  ASSERT_TRUE(ranks[1]->Attach().ok());
  std::vector<std::unique_ptr<PsExchange>> exchanges;
  std::vector<std::vector<std::vector<float>>> weights(2);
  for (int r = 0; r < 2; ++r) {
    exchanges.push_back(std::make_unique<PsExchange>(
        ranks[r].get(), std::vector<std::vector<int>>{{1}, {0}}, GetParam(),
        /*steps=*/true));
    weights[r] = {std::vector<float>(1200), std::vector<float>(600)};
    ASSERT_TRUE(exchanges[r]->Start(&weights[r], 0).ok());
  }
  auto step = [&](int r, float g, int64_t clock, absl::Status* s) {
    const std::vector<std::vector<float>> grads = {std::vector<float>(1200, g),
                                                   std::vector<float>(600, g)};
    exchanges[r]->LayerReady(0, grads, clock);
    exchanges[r]->LayerReady(1, grads, clock);
    StepStats stats;
    *s = exchanges[r]->FinishStep(clock, &weights[r], &stats);
  };
  absl::Status done[2];
  {
    std::thread one([&] { step(1, 0.1f, 1, &done[1]); });
    step(0, 0.1f, 1, &done[0]);
    one.join();
  }
  ASSERT_TRUE(done[0].ok()) << done[0];
  ASSERT_TRUE(done[1].ok()) << done[1];
  // Step 2: rank 1's calls wait on both shards for rank 0.
  auto before = AdminClient(admin_->caller()).Stats(1);
  ASSERT_TRUE(before.ok()) << before.status();
  std::thread two([&] { step(1, 0.2f, 2, &done[1]); });
  ASSERT_TRUE(WaitForStats(1, [&](const v1::StatsResponse& now) {
    return now.held_pulls() > before->held_pulls();
  }));
  const std::string empty = FreshTempDir("bsp-recover-none");
  ASSERT_TRUE(RestartLocalShard(&shards_, 1, [&](ShardServerConfig* c) {
                tweak_(c);
                c->checkpoint_dir = empty;
              }).ok());
  step(0, 0.2f, 2, &done[0]);
  two.join();
  ASSERT_TRUE(done[0].ok()) << done[0];
  ASSERT_TRUE(done[1].ok()) << done[1];
  if (GetParam() == PsExchange::Mode::kPrefetch) {
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(exchanges[r]->Finish(2).ok());
  }
  const float expected = kInit - kLr * (0.1f + 0.2f);
  for (int r = 0; r < 2; ++r) {
    for (const auto& t : weights[r]) {
      for (float v : t) ASSERT_FLOAT_EQ(v, expected) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, BspRecoverStepTest,
                         ::testing::Values(PsExchange::Mode::kLayered,
                                           PsExchange::Mode::kFused));

INSTANTIATE_TEST_SUITE_P(Modes, PsExchangeTest,
                         ::testing::Values(PsExchange::Mode::kLayered,
                                           PsExchange::Mode::kFused,
                                           PsExchange::Mode::kPrefetch));

}  // namespace
}  // namespace asyncps::testing
