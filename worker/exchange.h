// GradientExchange: how a worker's gradients become its next weights. The
// trainer loop is the same for every mode; only the exchange differs:
// through the parameter servers (async now; ssp and bsp add server-side
// waits), or by all-reduce among workers.
#ifndef ASYNCPS_WORKER_EXCHANGE_H_
#define ASYNCPS_WORKER_EXCHANGE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"

namespace asyncps {

struct StepStats {
  int64_t slices_pushed = 0;
  int64_t total_staleness = 0;
  int64_t max_staleness = 0;
};

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  // Fills `weights` (one vector per tensor, already sized) for step 0.
  virtual absl::Status Start(std::vector<std::vector<float>>* weights) = 0;
  // Layer `layer`'s gradients are ready in grads; the exchange may start
  // sending them. `grads` stays untouched until FinishStep returns.
  virtual void LayerReady(int layer,
                          const std::vector<std::vector<float>>& grads,
                          int64_t clock) = 0;
  // Every layer is ready; returns once `weights` (the same buffer given to
  // Start) hold the next step's weights. `clock` is the number of steps this
  // worker has completed.
  virtual absl::Status FinishStep(int64_t clock,
                                  std::vector<std::vector<float>>* weights,
                                  StepStats* stats) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_EXCHANGE_H_
