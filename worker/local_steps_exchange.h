// LocalStepsExchange: a worker's local steps between exchanges with an outer
// optimizer on the servers (--outer; docs/MODES.md "Outer optimizers"). Each
// step applies the worker's own (inner) optimizer to its weights here; every
// `local_steps`-th step the wrapped exchange (through the servers) carries
// what the round made: DiLoCo's pseudo-gradient (the round's starting
// weights less the worker's now), or EASGD's weights, whose answer, the new
// centre, the worker moves toward by alpha / (1 - alpha) of the difference.
#ifndef ASYNCPS_WORKER_LOCAL_STEPS_EXCHANGE_H_
#define ASYNCPS_WORKER_LOCAL_STEPS_EXCHANGE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/optimizer.h"
#include "proto/asyncps.pb.h"
#include "worker/exchange.h"

namespace asyncps {

struct LocalStepsConfig {
  enum Outer { kDiloco, kEasgd };
  Outer outer = kDiloco;
  int local_steps = 1;      // >= 1.
  v1::OptimizerSpec inner;  // Applied here, each step.
  float alpha = 0.5f;       // kEasgd: the moving rate, in (0, 1).
  // Dynamic local updates (asynchronous DiLoCo, Liu et al. 2024): each
  // round takes max(1, round(local_steps * mine / fastest)) steps, capped
  // at local_steps, where mine is this worker's steps a second over its
  // last round (exchange included) and fastest what `fastest` says of the
  // job's fastest worker (0: unknown, a round of local_steps).
  bool dynamic = false;
  std::function<double()> fastest;
  Clock* clock = Clock::Real();  // Borrowed; times the rounds.
};

// The steps of a dynamic round (LocalStepsConfig::dynamic): `local_steps`
// scaled by mine / fastest, rounded, in [1, local_steps]; local_steps when
// either rate is unknown (<= 0).
int DynamicRoundSteps(int local_steps, double mine, double fastest);

// Not thread-safe: the trainer's thread calls it, as any exchange.
class LocalStepsExchange : public GradientExchange {
 public:
  // `servers` exchanges with the servers (a PsExchange whose model was
  // declared with the outer optimizer's kind); `layer_tensors` as the
  // model's.
  LocalStepsExchange(const LocalStepsConfig& config,
                     std::unique_ptr<GradientExchange> servers,
                     std::vector<std::vector<int>> layer_tensors);

  // The wrapped exchange counts rounds: clock / local_steps.
  absl::Status Start(std::vector<std::vector<float>>* weights,
                     int64_t clock) override;
  int64_t resumed_clock() const override;
  void LayerReady(int layer, const std::vector<std::vector<float>>& grads,
                  int64_t clock) override;
  absl::Status FinishStep(int64_t clock,
                          std::vector<std::vector<float>>* weights,
                          StepStats* stats) override;
  absl::Status Finish(int64_t clock) override;

 private:
  // The round's exchange, after the step that ends it: `weights` become
  // what the outer optimizer makes of the servers' answer.
  absl::Status Exchange(int64_t round, std::vector<std::vector<float>>* weights,
                        StepStats* stats);

  const LocalStepsConfig config_;
  const std::unique_ptr<GradientExchange> servers_;
  const std::vector<std::vector<int>> layer_tensors_;
  // The weights the round started from (DiLoCo's anchor).
  std::vector<std::vector<float>> anchor_;
  // The buffer the wrapped exchange writes the servers' weights into.
  std::vector<std::vector<float>> answer_;
  std::vector<std::vector<float>> pushed_;  // What the round pushes.
  std::vector<OptimizerSlots> slots_;       // The inner optimizer's state.
  int64_t round_ = 0;       // Rounds exchanged so far (the servers' clock).
  int round_steps_ = 1;     // Steps this round takes.
  int done_ = 0;            // Steps taken this round.
  absl::Time round_start_;  // When this round's first step began.
  const std::vector<std::vector<float>>* grads_ = nullptr;  // This step's.
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_LOCAL_STEPS_EXCHANGE_H_
