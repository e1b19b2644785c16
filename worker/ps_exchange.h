// PsExchange: the parameter-server exchange (async, ssp, bsp). Each layer's
// gradient is pushed as soon as backward produces it, on a communication
// thread, and that layer's next weights are pulled right after its push, so
// communication overlaps the rest of the backward pass. In ssp and bsp the
// servers hold those pulls as the mode requires; the worker's loop is the
// same. Used by one trainer thread.
#ifndef ASYNCPS_WORKER_PS_EXCHANGE_H_
#define ASYNCPS_WORKER_PS_EXCHANGE_H_

#include <vector>

#include "client/ps_client.h"
#include "worker/exchange.h"
#include "worker/task_queue.h"

namespace asyncps {

class PsExchange final : public GradientExchange {
 public:
  // `client` is borrowed and must have a model; `layer_tensors[l]` lists
  // the tensor indices of layer l.
  PsExchange(PsClient* client, int rank,
             std::vector<std::vector<int>> layer_tensors);

  absl::Status Start(std::vector<std::vector<float>>* weights,
                     int64_t clock) override;
  void LayerReady(int layer, const std::vector<std::vector<float>>& grads,
                  int64_t clock) override;
  absl::Status FinishStep(int64_t clock,
                          std::vector<std::vector<float>>* weights,
                          StepStats* stats) override;

 private:
  PsClient* const client_;
  const int rank_;
  const std::vector<std::vector<int>> layer_tensors_;
  // Touched by the queue's thread only while tasks are pending; the trainer
  // reads them after FinishStep has drained the queue.
  std::vector<int64_t> versions_;
  std::vector<std::vector<float>>* weights_ = nullptr;
  StepStats step_stats_;
  TaskQueue queue_;  // Last: its thread stops before the rest is destroyed.
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PS_EXCHANGE_H_
