// PsExchange: the asynchronous parameter-server exchange. Each layer's
// gradient is pushed as soon as backward produces it, on a communication
// thread, and that layer's next weights are pulled right after its push, so
// communication overlaps the rest of the backward pass. Used by one trainer
// thread; the communication thread is internal.
#ifndef ASYNCPS_WORKER_PS_EXCHANGE_H_
#define ASYNCPS_WORKER_PS_EXCHANGE_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "worker/exchange.h"
#include "worker/ps_client.h"

namespace asyncps {

class PsExchange final : public GradientExchange {
 public:
  // `client` is borrowed and must have a model; `layer_tensors[l]` lists
  // the tensor indices of layer l.
  PsExchange(PsClient* client, int rank,
             std::vector<std::vector<int>> layer_tensors);
  ~PsExchange() override;

  absl::Status Start(std::vector<std::vector<float>>* weights) override;
  void LayerReady(int layer, const std::vector<std::vector<float>>& grads,
                  int64_t clock) override;
  absl::Status FinishStep(int64_t clock,
                          std::vector<std::vector<float>>* weights,
                          StepStats* stats) override;

 private:
  void Run();
  void Enqueue(std::function<absl::Status()> task);

  PsClient* const client_;
  const int rank_;
  const std::vector<std::vector<int>> layer_tensors_;
  // Written by the communication thread only while tasks are pending; the
  // trainer reads them after FinishStep has drained the queue.
  std::vector<int64_t> versions_;
  std::vector<std::vector<float>>* weights_ = nullptr;
  StepStats step_stats_;

  absl::Mutex mu_;
  std::deque<std::function<absl::Status()>> tasks_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_PS_EXCHANGE_H_
