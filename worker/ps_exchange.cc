#include "worker/ps_exchange.h"

#include <algorithm>

namespace asyncps {

PsExchange::PsExchange(PsClient* client, int rank,
                       std::vector<std::vector<int>> layer_tensors)
    : client_(client), rank_(rank), layer_tensors_(std::move(layer_tensors)) {}

absl::Status PsExchange::Start(std::vector<std::vector<float>>* weights,
                               int64_t clock) {
  weights_ = weights;
  return client_->Pull(AllTensors(layer_tensors_), weights, &versions_, rank_,
                       clock);
}

void PsExchange::LayerReady(int layer,
                            const std::vector<std::vector<float>>& grads,
                            int64_t clock) {
  const std::vector<int>* tensors = &layer_tensors_[layer];
  queue_.Enqueue([this, tensors, &grads, clock] {
    PushResult r;
    absl::Status s =
        client_->Push(*tensors, grads, versions_, rank_, clock, &r);
    if (!s.ok()) return s;
    step_stats_.slices_pushed += r.slices;
    step_stats_.total_staleness += r.total_staleness;
    step_stats_.max_staleness =
        std::max(step_stats_.max_staleness, r.max_staleness);
    step_stats_.dropped += r.dropped;
    return absl::OkStatus();
  });
  queue_.Enqueue([this, tensors, clock] {
    return client_->Pull(*tensors, weights_, &versions_, rank_, clock);
  });
}

absl::Status PsExchange::FinishStep(int64_t clock,
                                    std::vector<std::vector<float>>* weights,
                                    StepStats* stats) {
  // The pulls queued by LayerReady write into the buffer given to Start.
  (void)weights;
  absl::Status s = queue_.Drain();
  if (!versions_.empty()) {
    step_stats_.min_version =
        *std::min_element(versions_.begin(), versions_.end());
  }
  if (stats != nullptr) *stats = step_stats_;
  step_stats_ = StepStats();
  return s;
}

}  // namespace asyncps
