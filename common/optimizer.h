// Optimizers as plain functions over spans of f32, so the servers (async,
// ssp, bsp) and the all-reduce workers apply the very same arithmetic.
// Thread-compatible: callers serialise updates to one slice.
#ifndef ASYNCPS_COMMON_OPTIMIZER_H_
#define ASYNCPS_COMMON_OPTIMIZER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Delay compensation (DC-ASGD): out = g + lambda * g * g * (w_now -
// w_stale), elementwise. All spans the same size; `out` may be none of the
// inputs.
void DelayCompensate(float lambda, absl::Span<const float> g,
                     absl::Span<const float> w_now,
                     absl::Span<const float> w_stale, absl::Span<float> out);

// DC-ASGD-a's running mean square: its decay and the epsilon under its root.
inline constexpr float kMeanSquareDecay = 0.95f;
inline constexpr float kMeanSquareEpsilon = 1e-7f;

// DC-ASGD-a (Zheng et al. 2017): first mean_square = kMeanSquareDecay *
// mean_square + (1 - kMeanSquareDecay) * g * g; then, where `w_stale` is
// not empty, out = g + lambda / sqrt(mean_square + kMeanSquareEpsilon) * g *
// g * (w_now - w_stale), else out = g. Elementwise; `out` may be none of
// the inputs.
void AdaptiveDelayCompensate(float lambda, absl::Span<const float> g,
                             absl::Span<const float> w_now,
                             absl::Span<const float> w_stale,
                             absl::Span<float> mean_square,
                             absl::Span<float> out);

// w -= lr * (g + wd * w).
void SgdStep(float lr, float weight_decay, absl::Span<const float> g,
             absl::Span<float> w);

// v = momentum * v + g'; w -= lr * v, or with Nesterov w -= lr * (g' +
// momentum * v), where g' = g + wd * w.
// `dampening` (PyTorch's SGD): after the first update (`first`: v = g'),
// v = momentum * v + (1 - dampening) * g'.
void MomentumStep(float lr, float momentum, bool nesterov, float weight_decay,
                  absl::Span<const float> g, absl::Span<float> velocity,
                  absl::Span<float> w, float dampening = 0.0f,
                  bool first = false);

// Asynchronous DiLoCo's outer step with delayed Nesterov momentum (Liu et
// al. 2024): sum += g; w -= lr * g / delay; then, if `step` (this update's
// 1-based count) is a multiple of `delay`: velocity = momentum * velocity +
// sum / delay; w -= lr * momentum * velocity; sum = 0.
void DelayedNesterovStep(float lr, float momentum, int delay, int64_t step,
                         absl::Span<const float> g, absl::Span<float> velocity,
                         absl::Span<float> sum, absl::Span<float> w);

// EASGD's centre (Zhang et al. 2015): w += alpha * (x - w), x a worker's
// weights.
void ElasticStep(float alpha, absl::Span<const float> x, absl::Span<float> w);

// Adam with bias correction; `step` is this update's 1-based count.
void AdamStep(float lr, float beta1, float beta2, float epsilon,
              float weight_decay, int64_t step, absl::Span<const float> g,
              absl::Span<float> m, absl::Span<float> v, absl::Span<float> w);

// AdamW: w *= 1 - lr * weight_decay, then Adam without weight decay.
void AdamWStep(float lr, float beta1, float beta2, float epsilon,
               float weight_decay, int64_t step, absl::Span<const float> g,
               absl::Span<float> m, absl::Span<float> v, absl::Span<float> w);

// acc += g'^2; w -= lr * g' / (sqrt(acc) + epsilon).
void AdagradStep(float lr, float epsilon, float weight_decay,
                 absl::Span<const float> g, absl::Span<float> accumulator,
                 absl::Span<float> w);

// True for the kinds whose push is not a gradient but what a worker's local
// steps made (DELAYED_NESTEROV: a pseudo-gradient; ELASTIC: its weights).
inline bool IsOuterOptimizer(const v1::OptimizerSpec& spec) {
  return spec.kind() == v1::OptimizerSpec::DELAYED_NESTEROV ||
         spec.kind() == v1::OptimizerSpec::ELASTIC;
}

// Returns INVALID_ARGUMENT naming the bad field if `spec` is not usable
// (unknown kind, non-finite or negative learning rate, beta outside [0, 1),
// ...).
absl::Status ValidateOptimizer(const v1::OptimizerSpec& spec);

// What a kind keeps per weight beyond the weight itself: 0, 1 (momentum's
// velocity, Adam's m, AdaGrad's accumulator) or 2 slots (Adam's v; delayed
// Nesterov's velocity and pseudo-gradient sum), and the
// first slot's starting value (AdaGrad's initial accumulator; 0 otherwise).
int OptimizerSlotCount(const v1::OptimizerSpec& spec);
float InitialSlot1(const v1::OptimizerSpec& spec);

// One update of `g` to `w`, the learning rate multiplied by `lr_scale`,
// with the state held elsewhere: `slot1` and `slot2` as the kind needs them
// (each of w's size, or empty), `*steps` the updates applied before (then
// one more). OptimizerSlots::Apply for a slice; an embedding table's rows
// (server/embedding_table.h) each keep their own.
// REQUIRES: ValidateOptimizer(spec).ok(); g.size() == w.size().
void ApplyOptimizer(const v1::OptimizerSpec& spec, float lr_scale,
                    int64_t* steps, absl::Span<const float> g,
                    absl::Span<float> slot1, absl::Span<float> slot2,
                    absl::Span<float> w);

// The optimizer state of one slice: what the kind needs beyond the weights.
class OptimizerSlots {
 public:
  // REQUIRES: ValidateOptimizer(spec).ok().
  OptimizerSlots(const v1::OptimizerSpec& spec, size_t n);

  // Applies one update of `g` to `w`, with the learning rate multiplied by
  // `lr_scale` (1 normally; < 1 for staleness-aware scaling).
  // REQUIRES: g.size() == w.size() == n.
  void Apply(const v1::OptimizerSpec& spec, float lr_scale,
             absl::Span<const float> g, absl::Span<float> w);

  int64_t steps() const { return steps_; }
  // The state, for checkpoints.
  const std::vector<float>& slot1() const { return slot1_; }
  const std::vector<float>& slot2() const { return slot2_; }
  // Restores state saved from slots of the same spec and size; false (and
  // nothing changed) if the sizes do not match.
  bool Restore(std::vector<float> slot1, std::vector<float> slot2,
               int64_t steps);

 private:
  // Momentum velocity, Adam m, AdaGrad accumulator.
  std::vector<float> slot1_;
  std::vector<float> slot2_;  // Adam v, delayed Nesterov's sum.
  int64_t steps_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_OPTIMIZER_H_
