#include "common/optimizer.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace asyncps {

// The loops below read and write through __restrict pointers (the spans
// never overlap) and keep branches out of the loop body, so the compiler
// vectorizes them; each element gets exactly the same operations as a
// scalar loop would give it, so results are bit-identical.

void SgdStep(float lr, float weight_decay, absl::Span<const float> g,
             absl::Span<float> w) {
  const float* __restrict gp = g.data();
  float* __restrict wp = w.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) wp[i] -= lr * (gp[i] + weight_decay * wp[i]);
}

void DelayCompensate(float lambda, absl::Span<const float> g,
                     absl::Span<const float> w_now,
                     absl::Span<const float> w_stale, absl::Span<float> out) {
  const float* __restrict gp = g.data();
  const float* __restrict np = w_now.data();
  const float* __restrict sp = w_stale.data();
  float* __restrict op = out.data();
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    op[i] = gp[i] + lambda * gp[i] * gp[i] * (np[i] - sp[i]);
  }
}

void AdaptiveDelayCompensate(float lambda, absl::Span<const float> g,
                             absl::Span<const float> w_now,
                             absl::Span<const float> w_stale,
                             absl::Span<float> mean_square,
                             absl::Span<float> out) {
  const float* __restrict gp = g.data();
  float* __restrict mp = mean_square.data();
  const size_t n = out.size();
  for (size_t i = 0; i < n; ++i) {
    mp[i] =
        kMeanSquareDecay * mp[i] + (1.0f - kMeanSquareDecay) * gp[i] * gp[i];
  }
  float* __restrict op = out.data();
  if (w_stale.empty()) {
    for (size_t i = 0; i < n; ++i) op[i] = gp[i];
    return;
  }
  const float* __restrict np = w_now.data();
  const float* __restrict sp = w_stale.data();
  for (size_t i = 0; i < n; ++i) {
    op[i] = gp[i] + lambda / std::sqrt(mp[i] + kMeanSquareEpsilon) * gp[i] *
                        gp[i] * (np[i] - sp[i]);
  }
}

void MomentumStep(float lr, float momentum, bool nesterov, float weight_decay,
                  absl::Span<const float> g, absl::Span<float> velocity,
                  absl::Span<float> w, float dampening, bool first) {
  const float* __restrict gp = g.data();
  float* __restrict vp = velocity.data();
  float* __restrict wp = w.data();
  const size_t n = w.size();
  if (dampening != 0.0f) {
    // PyTorch's rule; the plain loops below are the dampening = 0 case
    // (v starts at 0, so the first update gives v = g' there too).
    const float keep = first ? 0.0f : momentum;
    const float take = first ? 1.0f : 1.0f - dampening;
    for (size_t i = 0; i < n; ++i) {
      const float gi = gp[i] + weight_decay * wp[i];
      vp[i] = keep * vp[i] + take * gi;
      wp[i] -= lr * (nesterov ? gi + momentum * vp[i] : vp[i]);
    }
    return;
  }
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float gi = gp[i] + weight_decay * wp[i];
      vp[i] = momentum * vp[i] + gi;
      wp[i] -= lr * (gi + momentum * vp[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float gi = gp[i] + weight_decay * wp[i];
      vp[i] = momentum * vp[i] + gi;
      wp[i] -= lr * vp[i];
    }
  }
}

void DelayedNesterovStep(float lr, float momentum, int delay, int64_t step,
                         absl::Span<const float> g, absl::Span<float> velocity,
                         absl::Span<float> sum, absl::Span<float> w) {
  const float d = static_cast<float>(delay);
  const float* __restrict gp = g.data();
  float* __restrict vp = velocity.data();
  float* __restrict bp = sum.data();
  float* __restrict wp = w.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) {
    bp[i] += gp[i];
    wp[i] -= lr * (gp[i] / d);
  }
  if (step % delay != 0) return;
  for (size_t i = 0; i < n; ++i) {
    vp[i] = momentum * vp[i] + bp[i] / d;
    wp[i] -= lr * momentum * vp[i];
    bp[i] = 0.0f;
  }
}

void ElasticStep(float alpha, absl::Span<const float> x, absl::Span<float> w) {
  const float* __restrict xp = x.data();
  float* __restrict wp = w.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) wp[i] += alpha * (xp[i] - wp[i]);
}

void AdamStep(float lr, float beta1, float beta2, float epsilon,
              float weight_decay, int64_t step, absl::Span<const float> g,
              absl::Span<float> m, absl::Span<float> v, absl::Span<float> w) {
  // The bias corrections in double, once; the loop in f32 (vectorized).
  const float inv_c1 = static_cast<float>(
      1.0 / (1.0 - std::pow(static_cast<double>(beta1), step)));
  const float inv_c2 = static_cast<float>(
      1.0 / (1.0 - std::pow(static_cast<double>(beta2), step)));
  const float* __restrict gp = g.data();
  float* __restrict mp = m.data();
  float* __restrict vp = v.data();
  float* __restrict wp = w.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) {
    const float gi = gp[i] + weight_decay * wp[i];
    mp[i] = beta1 * mp[i] + (1.0f - beta1) * gi;
    vp[i] = beta2 * vp[i] + (1.0f - beta2) * gi * gi;
    wp[i] -= lr * (mp[i] * inv_c1) / (std::sqrt(vp[i] * inv_c2) + epsilon);
  }
}

void AdamWStep(float lr, float beta1, float beta2, float epsilon,
               float weight_decay, int64_t step, absl::Span<const float> g,
               absl::Span<float> m, absl::Span<float> v, absl::Span<float> w) {
  const float shrink = 1.0f - lr * weight_decay;
  for (float& x : w) x *= shrink;
  AdamStep(lr, beta1, beta2, epsilon, 0.0f, step, g, m, v, w);
}

void AdagradStep(float lr, float epsilon, float weight_decay,
                 absl::Span<const float> g, absl::Span<float> accumulator,
                 absl::Span<float> w) {
  const float* __restrict gp = g.data();
  float* __restrict ap = accumulator.data();
  float* __restrict wp = w.data();
  const size_t n = w.size();
  for (size_t i = 0; i < n; ++i) {
    const float gi = gp[i] + weight_decay * wp[i];
    ap[i] += gi * gi;
    wp[i] -= lr * gi / (std::sqrt(ap[i]) + epsilon);
  }
}

namespace {

absl::Status CheckField(bool ok, absl::string_view field, float value,
                        absl::string_view want) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer ", field, " = ", value, " (must be ", want, ")"));
}

}  // namespace

absl::Status ValidateOptimizer(const v1::OptimizerSpec& spec) {
  using v1::OptimizerSpec;
  if (spec.kind() != OptimizerSpec::SGD &&
      spec.kind() != OptimizerSpec::MOMENTUM &&
      spec.kind() != OptimizerSpec::ADAM &&
      spec.kind() != OptimizerSpec::ADAMW &&
      spec.kind() != OptimizerSpec::ADAGRAD &&
      spec.kind() != OptimizerSpec::DELAYED_NESTEROV &&
      spec.kind() != OptimizerSpec::ELASTIC) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown optimizer kind ", static_cast<int>(spec.kind())));
  }
  auto finite_nonneg = [](float x) { return std::isfinite(x) && x >= 0; };
  absl::Status s =
      CheckField(finite_nonneg(spec.learning_rate()), "learning_rate",
                 spec.learning_rate(), "finite and >= 0");
  if (!s.ok()) return s;
  s = CheckField(finite_nonneg(spec.weight_decay()), "weight_decay",
                 spec.weight_decay(), "finite and >= 0");
  if (!s.ok()) return s;
  s = CheckField(finite_nonneg(spec.lr_decay()), "lr_decay", spec.lr_decay(),
                 "finite and >= 0");
  if (!s.ok()) return s;
  switch (spec.kind()) {
    case OptimizerSpec::MOMENTUM:
      s = CheckField(finite_nonneg(spec.dampening()) && spec.dampening() <= 1,
                     "dampening", spec.dampening(), "in [0, 1]");
      if (!s.ok()) return s;
      return CheckField(finite_nonneg(spec.momentum()) && spec.momentum() < 1,
                        "momentum", spec.momentum(), "in [0, 1)");
    case OptimizerSpec::ADAM:
    case OptimizerSpec::ADAMW:
      s = CheckField(finite_nonneg(spec.beta1()) && spec.beta1() < 1, "beta1",
                     spec.beta1(), "in [0, 1)");
      if (!s.ok()) return s;
      s = CheckField(finite_nonneg(spec.beta2()) && spec.beta2() < 1, "beta2",
                     spec.beta2(), "in [0, 1)");
      if (!s.ok()) return s;
      return CheckField(std::isfinite(spec.epsilon()) && spec.epsilon() > 0,
                        "epsilon", spec.epsilon(), "finite and > 0");
    case OptimizerSpec::DELAYED_NESTEROV:
      s = CheckField(spec.weight_decay() == 0, "weight_decay",
                     spec.weight_decay(), "0 for delayed_nesterov");
      if (!s.ok()) return s;
      s = CheckField(spec.delay() >= 1, "delay", spec.delay(),
                     "at least 1 for delayed_nesterov");
      if (!s.ok()) return s;
      return CheckField(finite_nonneg(spec.momentum()) && spec.momentum() < 1,
                        "momentum", spec.momentum(), "in [0, 1)");
    case OptimizerSpec::ELASTIC:
      s = CheckField(spec.weight_decay() == 0 && spec.lr_decay() == 0,
                     "weight_decay + lr_decay",
                     spec.weight_decay() + spec.lr_decay(), "0 for elastic");
      if (!s.ok()) return s;
      return CheckField(spec.learning_rate() > 0 && spec.learning_rate() < 1,
                        "learning_rate", spec.learning_rate(),
                        "the moving rate, in (0, 1), for elastic");
    case OptimizerSpec::ADAGRAD:
      s = CheckField(finite_nonneg(spec.initial_accumulator_value()),
                     "initial_accumulator_value",
                     spec.initial_accumulator_value(), "finite and >= 0");
      if (!s.ok()) return s;
      return CheckField(std::isfinite(spec.epsilon()) && spec.epsilon() > 0,
                        "epsilon", spec.epsilon(), "finite and > 0");
    default:
      return absl::OkStatus();
  }
}

int OptimizerSlotCount(const v1::OptimizerSpec& spec) {
  switch (spec.kind()) {
    case v1::OptimizerSpec::MOMENTUM:
    case v1::OptimizerSpec::ADAGRAD:
      return 1;
    case v1::OptimizerSpec::ADAM:
    case v1::OptimizerSpec::ADAMW:
    case v1::OptimizerSpec::DELAYED_NESTEROV:
      return 2;
    default:
      return 0;
  }
}

float InitialSlot1(const v1::OptimizerSpec& spec) {
  return spec.kind() == v1::OptimizerSpec::ADAGRAD
             ? spec.initial_accumulator_value()
             : 0.0f;
}

OptimizerSlots::OptimizerSlots(const v1::OptimizerSpec& spec, size_t n) {
  const int slots = OptimizerSlotCount(spec);
  if (slots >= 1) slot1_.assign(n, InitialSlot1(spec));
  if (slots >= 2) slot2_.assign(n, 0.0f);
}

bool OptimizerSlots::Restore(std::vector<float> slot1, std::vector<float> slot2,
                             int64_t steps) {
  if (slot1.size() != slot1_.size() || slot2.size() != slot2_.size() ||
      steps < 0) {
    return false;
  }
  slot1_ = std::move(slot1);
  slot2_ = std::move(slot2);
  steps_ = steps;
  return true;
}

void ApplyOptimizer(const v1::OptimizerSpec& spec, float lr_scale,
                    int64_t* steps, absl::Span<const float> g,
                    absl::Span<float> slot1, absl::Span<float> slot2,
                    absl::Span<float> w) {
  const float lr = spec.learning_rate() * lr_scale /
                   (1.0f + spec.lr_decay() * static_cast<float>(*steps));
  const bool first = *steps == 0;
  const int64_t step = ++*steps;
  switch (spec.kind()) {
    case v1::OptimizerSpec::SGD:
      SgdStep(lr, spec.weight_decay(), g, w);
      break;
    case v1::OptimizerSpec::MOMENTUM:
      MomentumStep(lr, spec.momentum(), spec.nesterov(), spec.weight_decay(), g,
                   slot1, w, spec.dampening(), first);
      break;
    case v1::OptimizerSpec::ADAMW:
      AdamWStep(lr, spec.beta1(), spec.beta2(), spec.epsilon(),
                spec.weight_decay(), step, g, slot1, slot2, w);
      break;
    case v1::OptimizerSpec::ADAM:
      AdamStep(lr, spec.beta1(), spec.beta2(), spec.epsilon(),
               spec.weight_decay(), step, g, slot1, slot2, w);
      break;
    case v1::OptimizerSpec::ADAGRAD:
      AdagradStep(lr, spec.epsilon(), spec.weight_decay(), g, slot1, w);
      break;
    case v1::OptimizerSpec::DELAYED_NESTEROV:
      DelayedNesterovStep(lr, spec.momentum(), spec.delay(), step, g, slot1,
                          slot2, w);
      break;
    case v1::OptimizerSpec::ELASTIC:
      // The moving rate as declared, never scaled: the worker takes its own
      // share of the step from it (docs/MODES.md "Outer optimizers").
      ElasticStep(spec.learning_rate(), g, w);
      break;
    default:
      break;
  }
}

void OptimizerSlots::Apply(const v1::OptimizerSpec& spec, float lr_scale,
                           absl::Span<const float> g, absl::Span<float> w) {
  ApplyOptimizer(spec, lr_scale, &steps_, g, absl::MakeSpan(slot1_),
                 absl::MakeSpan(slot2_), w);
}

}  // namespace asyncps
