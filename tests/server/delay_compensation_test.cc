// --stale_policy=dc (DC-ASGD, Zheng et al. 2017; issue #42): a stale
// gradient g, computed from version v, is applied as g + lambda * g * g *
// (w_now - w_v) while v is within the window of versions kept, and as it
// is beyond it (counted). Against a reference computed here, from the
// formula, over a seeded run of pushes with random bases.
#include <cmath>
#include <deque>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/mode.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "server/shard_store.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

class DelayCompensationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(store_.Declare(testing::SmallModel()).ok());
  }

  // Pushes `g` (4 values) computed from `version` with `policy`.
  void Push(const std::vector<float>& g, int64_t version,
            const PushPolicy& policy) {
    v1::PushRequest push = testing::SmallModelPush(0.0f, version);
    EncodeF32(g, push.mutable_gradients(0)->mutable_data());
    v1::PushResponse resp;
    ASSERT_TRUE(store_.Push(push, policy, &resp).ok());
  }

  std::vector<float> Weights() {
    v1::PullRequest req;
    *req.add_slices() = testing::SmallModelKey();
    v1::PullResponse resp;
    EXPECT_TRUE(store_.Pull(req, &resp).ok());
    std::vector<float> w(4);
    DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
    return w;
  }

  static PushPolicy Policy(float lambda, int window, bool adaptive = false) {
    PushPolicy policy;
    auto parsed = ParseStalePolicy(
        absl::StrCat(adaptive ? "dca:" : "dc:", lambda, ":", window));
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    policy.stale = *parsed;
    return policy;
  }

  void MatchesTheFormula(bool adaptive);

  ShardStore store_{0, 1, 64 << 20};
};

// By hand (SGD, learning rate 1, weights 10, lambda 0.5, a window of 2).
TEST_F(DelayCompensationTest, AStaleGradientIsCorrectedByTheWeightsSinceIt) {
  const PushPolicy dc = Policy(0.5f, 2);
  Push({1, 1, 1, 1}, 0, dc);  // Fresh: 10 - 1 = 9 (version 1).
  // From version 0 (10), now 9: 2 + 0.5 * 4 * (9 - 10) = 0.
  Push({2, 2, 2, 2}, 0, dc);
  EXPECT_EQ(Weights(), std::vector<float>(4, 9.0f));
  // Version 0 left the window (1 and 2 are kept): applied as it is.
  Push({1, 1, 1, 1}, 0, dc);
  EXPECT_EQ(Weights(), std::vector<float>(4, 8.0f));
  // From version 2 (9), now 8: 1 + 0.5 * 1 * (8 - 9) = 0.5.
  Push({1, 1, 1, 1}, 2, dc);
  EXPECT_EQ(Weights(), std::vector<float>(4, 7.5f));
  const ShardCounters c = store_.Counters();
  EXPECT_EQ(c[ShardCounter::kCompensated], 2);
  EXPECT_EQ(c[ShardCounter::kUncompensated], 1);
  EXPECT_EQ(c[ShardCounter::kUpdatesApplied], 4);
}

// 200 pushes with random gradients and bases up to 6 versions back, a
// window of 4: every weight equals the formula's, computed here with its
// own record of the versions; `adaptive`: DC-ASGD-a's lambda, from a
// running mean square kept here too.
void DelayCompensationTest::MatchesTheFormula(bool adaptive) {
  constexpr float kLambda = 0.3f;
  constexpr int kWindow = 4;
  const PushPolicy dc = Policy(kLambda, kWindow, adaptive);
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<float> w(4, 10.0f), mean_square(4, 0.0f);
  std::vector<std::vector<float>> history = {w};  // history[v]: version v.
  int compensated = 0, uncompensated = 0;
  for (int step = 0; step < 200; ++step) {
    const int64_t now = static_cast<int64_t>(history.size()) - 1;
    const int64_t base =
        std::max<int64_t>(0, now - static_cast<int64_t>(rng() % 7));
    std::vector<float> g(4);
    for (float& x : g) x = value(rng);
    Push(g, base, dc);
    // The reference: versions now - kWindow + 1 .. now are kept.
    std::vector<float> applied = g;
    std::vector<float> lambda(4, kLambda);
    for (int i = 0; adaptive && i < 4; ++i) {
      mean_square[i] = 0.95f * mean_square[i] + 0.05f * g[i] * g[i];
      lambda[i] = kLambda / std::sqrt(mean_square[i] + 1e-7f);
    }
    if (base < now) {
      if (now - base < kWindow) {
        for (int i = 0; i < 4; ++i) {
          applied[i] =
              g[i] + lambda[i] * g[i] * g[i] * (w[i] - history[base][i]);
        }
        ++compensated;
      } else {
        ++uncompensated;
      }
    }
    for (int i = 0; i < 4; ++i) w[i] -= 1.0f * (applied[i] + 0.0f * w[i]);
    history.push_back(w);
    const std::vector<float> got = Weights();
    for (int i = 0; i < 4; ++i) {
      ASSERT_FLOAT_EQ(got[i], w[i]) << "push " << step << " element " << i;
    }
  }
  EXPECT_GT(compensated, 50);
  EXPECT_GT(uncompensated, 10);
  EXPECT_EQ(store_.Counters()[ShardCounter::kCompensated], compensated);
  EXPECT_EQ(store_.Counters()[ShardCounter::kUncompensated], uncompensated);
}

TEST_F(DelayCompensationTest, MatchesTheFormulaOverASeededRun) {
  MatchesTheFormula(/*adaptive=*/false);
}

TEST_F(DelayCompensationTest, AdaptiveLambdaMatchesTheFormulaOverASeededRun) {
  MatchesTheFormula(/*adaptive=*/true);
}

// DC-ASGD-a's running mean square is part of the slice's state: a shard
// restored from a checkpoint (or a backup that joined) compensates as the
// one that saved it would. (The window of recent weights is not kept: the
// first push after the restore records it again.)
TEST_F(DelayCompensationTest, AdaptiveMeanSquareSurvivesACheckpoint) {
  const PushPolicy dca = Policy(0.5f, 8, /*adaptive=*/true);
  Push({1, 2, 3, 4}, 0, dca);
  Push({4, 3, 2, 1}, 0, dca);  // Stale: compensated, and into the mean.
  auto saved = store_.Snapshot();
  ASSERT_TRUE(saved.ok()) << saved.status();
  ShardStore restored{0, 1, 64 << 20};
  ASSERT_TRUE(restored.Restore(*saved).ok());
  for (ShardStore* s : {&store_, &restored}) {
    for (const auto& [g, version] :
         std::vector<std::pair<std::vector<float>, int64_t>>{
             {{0.5f, 1, 1.5f, 2}, 2}, {{2, 2, 1, 1}, 2}}) {
      v1::PushRequest push = testing::SmallModelPush(0.0f, version);
      EncodeF32(g, push.mutable_gradients(0)->mutable_data());
      v1::PushResponse resp;
      ASSERT_TRUE(s->Push(push, dca, &resp).ok());
    }
  }
  auto a = store_.Snapshot(), b = restored.Snapshot();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->slices(0).weights(), b->slices(0).weights());
  EXPECT_EQ(a->slices(0).dca_mean_square(), b->slices(0).dca_mean_square());
  EXPECT_FALSE(a->slices(0).dca_mean_square().empty());
}

// Lambda 0 is plain async SGD, whatever the staleness.
TEST_F(DelayCompensationTest, LambdaZeroIsPlainAsync) {
  const PushPolicy dc = Policy(0.0f, 8);
  Push({1, 1, 1, 1}, 0, dc);
  Push({2, 2, 2, 2}, 0, dc);
  Push({3, 3, 3, 3}, 1, dc);
  EXPECT_EQ(Weights(), std::vector<float>(4, 4.0f));
}

TEST(StalePolicy, DelayCompensationParsesAndRefusesBadValues) {
  auto p = ParseStalePolicy("dc:0.04");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, StalePolicy::kCompensate);
  EXPECT_FLOAT_EQ(p->dc_lambda, 0.04f);
  EXPECT_EQ(p->dc_window, 16);
  p = ParseStalePolicy("dc:2:1024");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->dc_window, 1024);
  EXPECT_FALSE(p->dc_adaptive);
  p = ParseStalePolicy("dca:0.5:8");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->kind, StalePolicy::kCompensate);
  EXPECT_TRUE(p->dc_adaptive);
  EXPECT_FLOAT_EQ(p->dc_lambda, 0.5f);
  EXPECT_EQ(p->dc_window, 8);
  for (const char* bad :
       {"dc:", "dc:-1", "dc:inf", "dc:x", "dc:1:0", "dc:1:1025", "dc:1:2:3",
        "dc:1:x", "dca:", "dca:-1", "dca:1:0", "dca", "dcb:1"}) {
    EXPECT_FALSE(ParseStalePolicy(bad).ok()) << bad;
  }
}

}  // namespace
}  // namespace asyncps
