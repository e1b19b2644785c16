#include "common/optimizer.h"

#include <vector>

#include "gtest/gtest.h"

namespace asyncps {
namespace {

// Expected values below are worked out by hand in the comments.

TEST(Optimizer, Sgd) {
  std::vector<float> w = {1.0f, -2.0f};
  std::vector<float> g = {0.5f, 0.25f};
  SgdStep(0.1f, 0.0f, g, absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], 0.95f);    // 1 - 0.1 * 0.5
  EXPECT_FLOAT_EQ(w[1], -2.025f);  // -2 - 0.1 * 0.25
}

TEST(Optimizer, SgdWeightDecay) {
  std::vector<float> w = {2.0f};
  std::vector<float> g = {1.0f};
  SgdStep(0.1f, 0.5f, g, absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], 1.8f);  // 2 - 0.1 * (1 + 0.5 * 2)
}

TEST(Optimizer, MomentumTwoSteps) {
  std::vector<float> w = {1.0f};
  std::vector<float> v = {0.0f};
  std::vector<float> g = {1.0f};
  MomentumStep(0.1f, 0.9f, false, 0.0f, g, absl::MakeSpan(v),
               absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(v[0], 1.0f);
  EXPECT_FLOAT_EQ(w[0], 0.9f);  // 1 - 0.1 * 1
  MomentumStep(0.1f, 0.9f, false, 0.0f, g, absl::MakeSpan(v),
               absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(v[0], 1.9f);   // 0.9 * 1 + 1
  EXPECT_FLOAT_EQ(w[0], 0.71f);  // 0.9 - 0.1 * 1.9
}

TEST(Optimizer, NesterovTwoSteps) {
  std::vector<float> w = {1.0f};
  std::vector<float> v = {0.0f};
  std::vector<float> g = {1.0f};
  MomentumStep(0.1f, 0.9f, true, 0.0f, g, absl::MakeSpan(v), absl::MakeSpan(w));
  // v = 1; w = 1 - 0.1 * (1 + 0.9 * 1) = 0.81
  EXPECT_FLOAT_EQ(w[0], 0.81f);
  MomentumStep(0.1f, 0.9f, true, 0.0f, g, absl::MakeSpan(v), absl::MakeSpan(w));
  // v = 1.9; w = 0.81 - 0.1 * (1 + 0.9 * 1.9) = 0.81 - 0.271 = 0.539
  EXPECT_FLOAT_EQ(w[0], 0.539f);
}

TEST(Optimizer, AdamFirstStepMovesByLearningRate) {
  // Step 1: m = 0.1 g, v = 0.001 g^2; m_hat = g, v_hat = g^2, so the step
  // is lr * g / (|g| + eps) = lr * sign(g) (eps negligible).
  std::vector<float> w = {1.0f, 1.0f};
  std::vector<float> m = {0, 0}, v = {0, 0};
  std::vector<float> g = {4.0f, -0.5f};
  AdamStep(0.01f, 0.9f, 0.999f, 1e-8f, 0.0f, 1, g, absl::MakeSpan(m),
           absl::MakeSpan(v), absl::MakeSpan(w));
  EXPECT_NEAR(w[0], 0.99f, 1e-6);
  EXPECT_NEAR(w[1], 1.01f, 1e-6);
  EXPECT_FLOAT_EQ(m[0], 0.4f);
  EXPECT_NEAR(v[0], 0.016f, 1e-6);  // 0.001 * 16
}

TEST(Optimizer, AdamSecondStep) {
  // g1 = 1, g2 = 3 with beta1 0.5, beta2 0.5, lr 1, eps 0:
  // m1 = 0.5, v1 = 0.5; w1 = 0 - 1 * (0.5/0.5) / sqrt(0.5/0.5) = -1.
  // m2 = 0.25 + 1.5 = 1.75, v2 = 0.25 + 4.5 = 4.75;
  // m_hat = 1.75 / 0.75 = 2.3333, v_hat = 4.75 / 0.75 = 6.3333;
  // w2 = -1 - 2.3333 / 2.51661 = -1.927173.
  std::vector<float> w = {0.0f}, m = {0}, v = {0};
  std::vector<float> g1 = {1.0f}, g2 = {3.0f};
  AdamStep(1.0f, 0.5f, 0.5f, 1e-12f, 0.0f, 1, g1, absl::MakeSpan(m),
           absl::MakeSpan(v), absl::MakeSpan(w));
  EXPECT_NEAR(w[0], -1.0f, 1e-6);
  AdamStep(1.0f, 0.5f, 0.5f, 1e-12f, 0.0f, 2, g2, absl::MakeSpan(m),
           absl::MakeSpan(v), absl::MakeSpan(w));
  EXPECT_NEAR(w[0], -1.927173f, 1e-5);
}

TEST(Optimizer, Adagrad) {
  // acc = 0.1 + 4 = 4.1 after g = 2; w = 1 - 0.5 * 2 / (sqrt(4.1) + 0)
  //   = 1 - 1 / 2.024846 = 0.506135.
  std::vector<float> w = {1.0f}, acc = {0.1f}, g = {2.0f};
  AdagradStep(0.5f, 1e-10f, 0.0f, g, absl::MakeSpan(acc), absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(acc[0], 4.1f);
  EXPECT_NEAR(w[0], 0.506135f, 1e-6);
}

// PyTorch's SGD with dampening: the first update takes the gradient
// whole (v = g), later ones (1 - dampening) of it.
TEST(Optimizer, MomentumDampeningAsPyTorch) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::MOMENTUM);
  spec.set_learning_rate(1.0f);
  spec.set_momentum(0.5f);
  spec.set_dampening(0.5f);
  OptimizerSlots slots(spec, 1);
  std::vector<float> w = {0.0f}, g = {1.0f};
  slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], -1.0f);  // v = 1.
  slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], -2.0f);  // v = 0.5 * 1 + 0.5 * 1 = 1.
}

// AdamW decays the weight apart from the gradient: w *= 1 - lr * wd, then
// Adam's first step moves it by lr.
TEST(Optimizer, AdamWDecouplesWeightDecay) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::ADAMW);
  spec.set_learning_rate(0.1f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_epsilon(1e-8f);
  spec.set_weight_decay(0.5f);
  ASSERT_TRUE(ValidateOptimizer(spec).ok());
  OptimizerSlots slots(spec, 1);
  std::vector<float> w = {2.0f}, g = {3.0f};
  slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));
  EXPECT_NEAR(w[0], 2.0f * (1.0f - 0.05f) - 0.1f, 1e-6);
}

TEST(Optimizer, SlotsDispatchAndScale) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::SGD);
  spec.set_learning_rate(1.0f);
  OptimizerSlots slots(spec, 1);
  std::vector<float> w = {1.0f}, g = {1.0f};
  slots.Apply(spec, 0.5f, g, absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_EQ(slots.steps(), 1);
}

TEST(Optimizer, InverseTimeDecay) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::SGD);
  spec.set_learning_rate(1.0f);
  spec.set_lr_decay(0.5f);
  OptimizerSlots slots(spec, 1);
  std::vector<float> w = {0.0f}, g = {1.0f};
  slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));  // lr 1 / (1 + 0) = 1
  EXPECT_FLOAT_EQ(w[0], -1.0f);
  slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));  // lr 1 / (1 + 0.5) = 2/3
  EXPECT_FLOAT_EQ(w[0], -1.0f - 2.0f / 3.0f);
  slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));  // lr 1 / (1 + 1) = 1/2
  EXPECT_FLOAT_EQ(w[0], -1.0f - 2.0f / 3.0f - 0.5f);
}

TEST(Optimizer, ValidateNamesTheBadField) {
  v1::OptimizerSpec spec;
  EXPECT_EQ(ValidateOptimizer(spec).code(), absl::StatusCode::kInvalidArgument);
  spec.set_kind(v1::OptimizerSpec::ADAM);
  spec.set_learning_rate(0.001f);
  spec.set_beta1(0.9f);
  spec.set_beta2(1.5f);
  spec.set_epsilon(1e-8f);
  absl::Status s = ValidateOptimizer(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("beta2"), absl::string_view::npos) << s;
  spec.set_beta2(0.999f);
  EXPECT_TRUE(ValidateOptimizer(spec).ok());
  spec.set_learning_rate(std::numeric_limits<float>::quiet_NaN());
  EXPECT_NE(ValidateOptimizer(spec).message().find("learning_rate"),
            absl::string_view::npos);
}

v1::OptimizerSpec DelayedNesterov(float lr, float momentum, int delay) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::DELAYED_NESTEROV);
  spec.set_learning_rate(lr);
  spec.set_momentum(momentum);
  spec.set_delay(delay);
  return spec;
}

TEST(Optimizer, DelayedNesterovByHand) {
  const v1::OptimizerSpec spec = DelayedNesterov(0.5f, 0.9f, 2);
  ASSERT_TRUE(ValidateOptimizer(spec).ok());
  ASSERT_EQ(OptimizerSlotCount(spec), 2);
  OptimizerSlots slots(spec, 1);
  std::vector<float> w = {1.0f};
  slots.Apply(spec, 1.0f, std::vector<float>{1.0f}, absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], 0.75f);  // 1 - 0.5 * 1 / 2; no momentum yet
  EXPECT_FLOAT_EQ(slots.slot1()[0], 0.0f);
  EXPECT_FLOAT_EQ(slots.slot2()[0], 1.0f);  // The round's sum so far.
  slots.Apply(spec, 1.0f, std::vector<float>{3.0f}, absl::MakeSpan(w));
  // 0.75 - 0.5 * 3 / 2 = 0; v = 0.9 * 0 + 4 / 2 = 2; 0 - 0.5 * 0.9 * 2.
  EXPECT_FLOAT_EQ(slots.slot1()[0], 2.0f);
  EXPECT_FLOAT_EQ(slots.slot2()[0], 0.0f);
  EXPECT_FLOAT_EQ(w[0], -0.9f);
}

// With `delay` pushes a round, delayed Nesterov moves the weights as a
// synchronous Nesterov step on the round's mean does (sync DiLoCo's outer
// step), round after round.
TEST(Optimizer, DelayedNesterovMatchesNesterovOnEachRoundsMean) {
  const int kDelay = 3;
  const v1::OptimizerSpec spec = DelayedNesterov(0.7f, 0.9f, kDelay);
  OptimizerSlots slots(spec, 2);
  std::vector<float> w = {0.5f, -1.0f}, ref = w, ref_v = {0.0f, 0.0f};
  float seed = 0.3f;
  for (int round = 0; round < 4; ++round) {
    std::vector<float> mean = {0.0f, 0.0f};
    for (int push = 0; push < kDelay; ++push) {
      seed = seed * 1.7f - static_cast<float>(static_cast<int>(seed * 1.7f));
      std::vector<float> g = {seed - 0.5f, 0.25f - seed};
      slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));
      for (int i = 0; i < 2; ++i) mean[i] += g[i] / kDelay;
    }
    MomentumStep(0.7f, 0.9f, /*nesterov=*/true, 0.0f, mean,
                 absl::MakeSpan(ref_v), absl::MakeSpan(ref));
    for (int i = 0; i < 2; ++i) {
      EXPECT_NEAR(w[i], ref[i], 1e-5) << "round " << round;
      EXPECT_NEAR(slots.slot1()[i], ref_v[i], 1e-5) << "round " << round;
    }
  }
}

TEST(Optimizer, ElasticMovesTheCentreAndIgnoresTheScale) {
  v1::OptimizerSpec spec;
  spec.set_kind(v1::OptimizerSpec::ELASTIC);
  spec.set_learning_rate(0.25f);
  ASSERT_TRUE(ValidateOptimizer(spec).ok());
  ASSERT_EQ(OptimizerSlotCount(spec), 0);
  OptimizerSlots slots(spec, 1);
  std::vector<float> centre = {1.0f};
  slots.Apply(spec, /*lr_scale=*/0.5f, std::vector<float>{3.0f},
              absl::MakeSpan(centre));
  EXPECT_FLOAT_EQ(centre[0], 1.5f);  // 1 + 0.25 * (3 - 1), scale unused.
  // The worker's share, from the new centre alone: alpha / (1 - alpha) *
  // (x - centre) = (3 - 1.5) / 3 = 0.5 = alpha * (x - the old centre).
  EXPECT_FLOAT_EQ(0.25f / 0.75f * (3.0f - centre[0]), 0.5f);
}

TEST(Optimizer, ValidateOuterOptimizers) {
  v1::OptimizerSpec spec = DelayedNesterov(0.7f, 0.9f, 0);
  EXPECT_TRUE(IsOuterOptimizer(spec));
  absl::Status s = ValidateOptimizer(spec);
  EXPECT_NE(s.message().find("delay"), absl::string_view::npos) << s;
  spec.set_delay(4);
  EXPECT_TRUE(ValidateOptimizer(spec).ok());
  spec.set_momentum(1.0f);
  EXPECT_NE(ValidateOptimizer(spec).message().find("momentum"),
            absl::string_view::npos);
  spec.set_momentum(0.9f);
  spec.set_weight_decay(0.1f);
  EXPECT_NE(ValidateOptimizer(spec).message().find("weight_decay"),
            absl::string_view::npos);
  v1::OptimizerSpec elastic;
  elastic.set_kind(v1::OptimizerSpec::ELASTIC);
  EXPECT_TRUE(IsOuterOptimizer(elastic));
  for (float alpha : {0.0f, 1.0f, -0.5f}) {
    elastic.set_learning_rate(alpha);
    s = ValidateOptimizer(elastic);
    EXPECT_NE(s.message().find("learning_rate"), absl::string_view::npos) << s;
  }
  elastic.set_learning_rate(0.5f);
  elastic.set_lr_decay(0.1f);
  EXPECT_FALSE(ValidateOptimizer(elastic).ok());
  v1::OptimizerSpec sgd;
  sgd.set_kind(v1::OptimizerSpec::SGD);
  EXPECT_FALSE(IsOuterOptimizer(sgd));
}

}  // namespace
}  // namespace asyncps
