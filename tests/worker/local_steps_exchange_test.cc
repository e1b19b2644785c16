// LocalStepsExchange (ps_worker --outer) in process, around a fake of the
// servers' exchange that records what each round pushes and answers with
// weights it chooses: DiLoCo's pseudo-gradient, EASGD's move toward the
// centre, the rounds' clocks, and dynamic rounds sized by the rates.
#include "worker/local_steps_exchange.h"

#include <memory>
#include <utility>
#include <vector>

#include "common/clock.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

using Tensors = std::vector<std::vector<float>>;

// The servers, faked: start weights, and each round's answer.
class FakeServers : public GradientExchange {
 public:
  explicit FakeServers(Tensors start) : start_(std::move(start)) {}
  absl::Status Start(Tensors* weights, int64_t clock) override {
    *weights = start_;
    buffer_ = weights;
    return absl::OkStatus();
  }
  void LayerReady(int layer, const Tensors& grads, int64_t clock) override {
    pushed_ = &grads;
  }
  absl::Status FinishStep(int64_t clock, Tensors* weights,
                          StepStats* stats) override {
    EXPECT_EQ(weights, buffer_) << "not the buffer given to Start";
    pushes.push_back(*pushed_);
    clocks.push_back(clock);
    *weights = answer;
    return absl::OkStatus();
  }
  Tensors answer;
  std::vector<Tensors> pushes;
  std::vector<int64_t> clocks;

 private:
  const Tensors start_;
  Tensors* buffer_ = nullptr;
  const Tensors* pushed_ = nullptr;
};

v1::OptimizerSpec Sgd(float lr) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::SGD);
  spec.set_learning_rate(lr);
  return spec;
}

// One step of the trainer: gradient `g` for the single tensor.
absl::Status Step(LocalStepsExchange& e, int64_t clock, float g, Tensors* w) {
  const Tensors grads = {{g, g}};
  e.LayerReady(0, grads, clock);
  StepStats stats;
  return e.FinishStep(clock, w, &stats);
}

TEST(LocalSteps, DilocoPushesThePseudoGradientOfEachRound) {
  auto servers = std::make_unique<FakeServers>(Tensors{{1.0f, 2.0f}});
  FakeServers* fake = servers.get();
  LocalStepsConfig config;
  config.outer = LocalStepsConfig::kDiloco;
  config.local_steps = 2;
  config.inner = Sgd(0.5f);
  LocalStepsExchange e(config, std::move(servers), {{0}});
  Tensors w = {{0.0f, 0.0f}};
  ASSERT_TRUE(e.Start(&w, 0).ok());
  EXPECT_EQ(w, (Tensors{{1.0f, 2.0f}}));
  fake->answer = {{10.0f, 20.0f}};
  ASSERT_TRUE(Step(e, 1, 1.0f, &w).ok());  // 0.5, 1.5: no exchange yet.
  EXPECT_TRUE(fake->pushes.empty());
  EXPECT_EQ(w, (Tensors{{0.5f, 1.5f}}));
  ASSERT_TRUE(Step(e, 2, 1.0f, &w).ok());  // 0, 1: the round's end.
  ASSERT_EQ(fake->pushes.size(), 1u);
  EXPECT_EQ(fake->pushes[0], (Tensors{{1.0f, 1.0f}}));  // Start less now.
  EXPECT_EQ(fake->clocks[0], 1);                        // Round 1.
  EXPECT_EQ(w, (Tensors{{10.0f, 20.0f}}));              // The servers' weights.
  ASSERT_TRUE(Step(e, 3, 2.0f, &w).ok());
  ASSERT_TRUE(Step(e, 4, 2.0f, &w).ok());
  ASSERT_EQ(fake->pushes.size(), 2u);
  EXPECT_EQ(fake->pushes[1], (Tensors{{2.0f, 2.0f}}));  // From 10, 20.
  EXPECT_EQ(fake->clocks[1], 2);
}

TEST(LocalSteps, EasgdMovesTowardTheCentreByAlphaOfTheOldDifference) {
  auto servers = std::make_unique<FakeServers>(Tensors{{0.0f, 0.0f}});
  FakeServers* fake = servers.get();
  LocalStepsConfig config;
  config.outer = LocalStepsConfig::kEasgd;
  config.local_steps = 1;
  config.inner = Sgd(1.0f);
  config.alpha = 0.25f;
  LocalStepsExchange e(config, std::move(servers), {{0}});
  Tensors w;
  w = {{0.0f, 0.0f}};
  ASSERT_TRUE(e.Start(&w, 0).ok());
  // x = -4 after the step; the centre was 0 and moves to 0.25 * -4 = -1.
  fake->answer = {{-1.0f, -1.0f}};
  ASSERT_TRUE(Step(e, 1, 4.0f, &w).ok());
  EXPECT_EQ(fake->pushes[0], (Tensors{{-4.0f, -4.0f}}));  // x itself.
  // x -= 0.25 * (x - 0): -4 + 1 = -3, from the new centre alone.
  EXPECT_FLOAT_EQ(w[0][0], -3.0f);
  EXPECT_FLOAT_EQ(w[0][1], -3.0f);
}

TEST(LocalSteps, DynamicRoundsScaleWithTheRates) {
  EXPECT_EQ(DynamicRoundSteps(8, 1.0, 4.0), 2);
  EXPECT_EQ(DynamicRoundSteps(8, 4.0, 4.0), 8);
  EXPECT_EQ(DynamicRoundSteps(8, 0.1, 4.0), 1);  // At least one step.
  EXPECT_EQ(DynamicRoundSteps(8, 6.0, 4.0), 8);  // At most local_steps.
  EXPECT_EQ(DynamicRoundSteps(8, 0.0, 4.0), 8);  // Unknown: local_steps.
  EXPECT_EQ(DynamicRoundSteps(8, 2.0, 0.0), 8);

  // A worker taking 1 s a step where the fastest does 4 steps a second:
  // its first round is the full 8 steps, the next ones 2.
  auto servers = std::make_unique<FakeServers>(Tensors{{0.0f, 0.0f}});
  FakeServers* fake = servers.get();
  fake->answer = {{0.0f, 0.0f}};
  ManualClock clock;
  LocalStepsConfig config;
  config.local_steps = 8;
  config.inner = Sgd(0.1f);
  config.dynamic = true;
  config.fastest = [] { return 4.0; };
  config.clock = &clock;
  LocalStepsExchange e(config, std::move(servers), {{0}});
  Tensors w = {{0.0f, 0.0f}};
  ASSERT_TRUE(e.Start(&w, 0).ok());
  for (int64_t step = 1; step <= 12; ++step) {
    clock.Advance(absl::Seconds(1));
    ASSERT_TRUE(Step(e, step, 1.0f, &w).ok());
  }
  EXPECT_EQ(fake->clocks, (std::vector<int64_t>{1, 2, 3}));  // 8, 2, 2.
}

}  // namespace
}  // namespace asyncps
