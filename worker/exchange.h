// GradientExchange: how a worker's gradients become its next weights. The
// trainer loop is the same for every mode; only the exchange differs:
// through the parameter servers (async now; ssp and bsp add server-side
// waits), or by all-reduce among workers.
#ifndef ASYNCPS_WORKER_EXCHANGE_H_
#define ASYNCPS_WORKER_EXCHANGE_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "asyncps/client.h"

namespace asyncps {

// What one step's exchange did: the servers' answers to its pushes (the
// same PushStats the client library sums them into), and where the worker
// stands after it.
struct StepStats {
  PushStats pushed;
  // The lowest version among the weights now held (updates the servers have
  // applied to every slice); -1 if unknown.
  int64_t min_version = -1;
  // If >= 0, the clock the worker goes on from instead of the step's own:
  // bsp, its gradient came back dropped as late and the job has applied
  // steps up to one past here (it stalled, or rejoined), so it does not
  // redo steps the others have done; allreduce, the ring re-formed at this
  // clock.
  int64_t next_clock = -1;
};

// Every tensor of `layer_tensors`, in ascending order.
std::vector<int> AllTensors(const std::vector<std::vector<int>>& layer_tensors);

class GradientExchange {
 public:
  virtual ~GradientExchange() = default;
  // Fills `weights` (one vector per tensor, already sized) for the first
  // step; `clock` is the steps completed before it (0, or where a rejoining
  // worker resumes).
  virtual absl::Status Start(std::vector<std::vector<float>>* weights,
                             int64_t clock) = 0;
  // After Start: if >= 0, the clock the worker goes on from instead of
  // Start's `clock` (allreduce: the ring's step, which a replacement that
  // was told a stale clock takes up).
  virtual int64_t resumed_clock() const { return -1; }
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
  // Training is over (the weights given to Start are still alive).
  virtual absl::Status Finish(int64_t clock) { return absl::OkStatus(); }
  // Told to stop (SIGTERM): whether the worker must do one more step to
  // leave cleanly (an elastic allreduce rank says it leaves in a step's
  // vote; one that stopped after the vote would fail the others' next
  // step instead).
  virtual bool StepToLeave() const { return false; }
};

inline std::vector<int> AllTensors(
    const std::vector<std::vector<int>>& layer_tensors) {
  std::vector<int> all;
  for (const auto& l : layer_tensors) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_EXCHANGE_H_
