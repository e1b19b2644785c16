// PsExchange in bsp against two in-process shards over loopback, a shard
// restarted mid-step: one restored from an older checkpoint does not strand
// a worker waiting for a layer the other worker had already finished, and
// one that lost the model has the step pushed again by both exchanges
// (layered and fused), every gradient applied once.
#include <filesystem>
#include <functional>
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
#include "tests/integration/ps_exchange_job.h"
#include "tests/integration/test_cluster.h"
#include "tests/testing/temp_dir.h"
#include "worker/ps_exchange.h"

namespace asyncps::testing {
namespace {

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

  // Declares the model (w: 1200, b: 600, all kInit; SGD at kLr).
  static absl::Status Declare(Client* client) {
    OptimizerOptions sgd;
    sgd.kind = "sgd";
    sgd.learning_rate = kLr;
    return client->Declare(
        {{"w", {40, 30}}, {"b", {600}}},
        {std::vector<float>(1200, kInit), std::vector<float>(600, kInit)}, sgd);
  }

  // Both shards checkpoint now; returns a copy of their checkpoints, kept
  // aside: an in-process shutdown writes a last checkpoint, which a
  // SIGKILLed shard would not have.
  std::string CheckpointAside(const std::string& name) {
    for (int shard = 0; shard < 2; ++shard) {
      EXPECT_TRUE(AdminClient(admin_->caller()).Checkpoint(shard).ok());
    }
    const std::string aside = FreshTempDir(name);
    std::filesystem::copy(
        dir_, aside,
        std::filesystem::copy_options::recursive |
            std::filesystem::copy_options::overwrite_existing);
    return aside;
  }

  std::string dir_ = FreshTempDir("bsp-restart");
  std::function<void(ShardServerConfig*)> tweak_;
  LocalShards shards_;
  std::unique_ptr<PsClient> admin_;
};

// Rank 0's side of the two layers (b, else w), by hand as PsExchange does
// it: pushes computed from one held snapshot, pulls into it after the push,
// and a pull answered ABORTED pushes its layer again and pulls whichever
// incarnation the shard holds.
class LayersByHand {
 public:
  explicit LayersByHand(Client* client) : client_(client) {}

  // Resolves b and w and pulls step 0's weights into the snapshot.
  absl::Status Start() {
    auto b = client_->Resolve({"b"});
    auto w = client_->Resolve({"w"});
    if (!b.ok() || !w.ok()) return b.ok() ? w.status() : b.status();
    b_ = *std::move(b);
    w_ = *std::move(w);
    CallOptions start;
    start.step = 0;
    start.into = &held_;
    return client_->Pull({"w", "b"}, {absl::MakeSpan(w0), absl::MakeSpan(b0)},
                         start);
  }

  absl::Status Push(bool is_b, float g, int64_t step, bool again) {
    const std::vector<float> grad(is_b ? 600 : 1200, g);
    CallOptions o;
    o.step = step;
    o.from = &held_;
    o.again = again;
    return client_->Push(is_b ? b_ : w_, {absl::MakeConstSpan(grad)}, o);
  }

  absl::Status Pull(bool is_b, float g, int64_t step) {
    CallOptions o;
    o.step = step;
    o.into = &held_;
    o.after_push = true;
    std::vector<absl::Span<float>> out = {is_b ? absl::MakeSpan(b0)
                                               : absl::MakeSpan(w0)};
    absl::Status s = client_->Pull(is_b ? b_ : w_, out, o);
    if (s.code() == absl::StatusCode::kAborted) {
      EXPECT_TRUE(Push(is_b, g, step, /*again=*/true).ok());
      o.any_incarnation = true;
      s = client_->Pull(is_b ? b_ : w_, out, o);
    }
    return s;
  }

  std::vector<float> w0 = std::vector<float>(1200);
  std::vector<float> b0 = std::vector<float>(600);

 private:
  Client* const client_;
  TensorSet b_, w_;
  Snapshot held_;
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
  ASSERT_TRUE(Declare(rank0.get()).ok());
  ASSERT_TRUE(rank1->Attach().ok());
  PsExchange exchange(rank1.get(), {{1}, {0}}, PsExchange::Mode::kLayered,
                      /*steps=*/true);
  std::vector<std::vector<float>> weights1 = {std::vector<float>(1200),
                                              std::vector<float>(600)};
  ASSERT_TRUE(exchange.Start(&weights1, 0).ok());
  LayersByHand layers(rank0.get());
  ASSERT_TRUE(layers.Start().ok());
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
  ASSERT_TRUE(layers.Push(true, 0.1f, 1, false).ok());
  ASSERT_TRUE(layers.Pull(true, 0.1f, 1).ok());
  ASSERT_TRUE(layers.Push(false, 0.1f, 1, false).ok());
  ASSERT_TRUE(layers.Pull(false, 0.1f, 1).ok());
  one.join();
  ASSERT_TRUE(step1_done.ok()) << step1_done;
  const std::string step1 = CheckpointAside("bsp-restart-step1");
  ASSERT_FALSE(HasFailure());

  // Step 2: rank 0 pushes b; rank 1 gets b's step and waits in w's pull
  // (held on shard 0 too, which says it has come that far).
  ASSERT_TRUE(layers.Push(true, 0.2f, 2, false).ok());
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
  const absl::Status pulled_b = layers.Pull(true, 0.2f, 2);
  EXPECT_TRUE(pulled_b.ok()) << pulled_b;
  if (pulled_b.ok()) {
    ASSERT_TRUE(layers.Push(false, 0.2f, 2, false).ok());
    const absl::Status pulled_w = layers.Pull(false, 0.2f, 2);
    EXPECT_TRUE(pulled_w.ok()) << pulled_w;
  }
  two.join();
  ASSERT_TRUE(step2.ok()) << step2;
  // SGD over two steps whose two gradients were equal: init - lr * (0.1 +
  // 0.2) everywhere, on both workers.
  const float expected = kInit - kLr * (0.1f + 0.2f);
  for (float v : weights1[0]) ASSERT_FLOAT_EQ(v, expected);
  for (float v : weights1[1]) ASSERT_FLOAT_EQ(v, expected);
  EXPECT_EQ(layers.w0, weights1[0]);
  EXPECT_EQ(layers.b0, weights1[1]);
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
  ASSERT_TRUE(Declare(ranks[0].get()).ok());
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

}  // namespace
}  // namespace asyncps::testing
