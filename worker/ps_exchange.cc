#include "worker/ps_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {

PsExchange::PsExchange(PsClient* client, int rank,
                       std::vector<std::vector<int>> layer_tensors, Mode mode)
    : client_(client),
      rank_(rank),
      layer_tensors_(std::move(layer_tensors)),
      all_tensors_(AllTensors(layer_tensors_)),
      mode_(mode) {}

const char* PsExchange::ModeName(Mode mode) {
  switch (mode) {
    case Mode::kFused:
      return "fused";
    case Mode::kPrefetch:
      return "prefetch";
    default:
      return "layered";
  }
}

absl::StatusOr<PsExchange::Mode> PsExchange::ParseMode(
    const std::string& text) {
  if (text == "layered") return Mode::kLayered;
  if (text == "fused") return Mode::kFused;
  if (text == "prefetch") return Mode::kPrefetch;
  return absl::InvalidArgumentError(
      absl::StrCat("--exchange=", text, " (want layered, fused or prefetch)"));
}

absl::Status PsExchange::Start(std::vector<std::vector<float>>* weights,
                               int64_t clock) {
  weights_ = weights;
  RETURN_IF_ERROR(
      client_->Pull(all_tensors_, weights, &versions_, rank_, clock));
  if (mode_ == Mode::kPrefetch) staged_ = *weights;  // Sized like them.
  return absl::OkStatus();
}

void PsExchange::AddPushResult(const PushResult& r) {
  step_stats_.slices_pushed += r.slices;
  step_stats_.total_staleness += r.total_staleness;
  step_stats_.max_staleness =
      std::max(step_stats_.max_staleness, r.max_staleness);
  step_stats_.dropped += r.dropped;
}

void PsExchange::LayerReady(int layer,
                            const std::vector<std::vector<float>>& grads,
                            int64_t clock) {
  if (mode_ != Mode::kLayered) {
    grads_ = &grads;  // Sent whole at FinishStep.
    return;
  }
  const std::vector<int>* tensors = &layer_tensors_[layer];
  queue_.Enqueue([this, tensors, &grads, clock] {
    PushResult r;
    RETURN_IF_ERROR(
        client_->Push(*tensors, grads, versions_, rank_, clock, &r));
    AddPushResult(r);
    return absl::OkStatus();
  });
  queue_.Enqueue([this, tensors, clock] {
    return client_->Pull(*tensors, weights_, &versions_, rank_, clock);
  });
}

absl::Status PsExchange::FinishStep(int64_t clock,
                                    std::vector<std::vector<float>>* weights,
                                    StepStats* stats) {
  // Either way the weights land in the buffer given to Start.
  (void)weights;
  switch (mode_) {
    case Mode::kFused:
      return FinishFused(clock, stats);
    case Mode::kPrefetch:
      return FinishPrefetched(clock, stats);
    default:
      return FinishLayered(stats);
  }
}

void PsExchange::TakeStepStats(StepStats* stats) {
  if (!versions_.empty()) {
    step_stats_.min_version =
        *std::min_element(versions_.begin(), versions_.end());
  }
  if (stats != nullptr) *stats = step_stats_;
  step_stats_ = StepStats();
}

void PsExchange::AdoptStaged() {
  if (!in_flight_) return;
  weights_->swap(staged_);
  versions_.swap(staged_versions_);
  in_flight_ = false;
}

absl::Status PsExchange::FinishLayered(StepStats* stats) {
  absl::Status s = queue_.Drain();
  TakeStepStats(stats);
  return s;
}

absl::Status PsExchange::FinishFused(int64_t clock, StepStats* stats) {
  PushResult r;
  RETURN_IF_ERROR(client_->PushPull(all_tensors_, *grads_, versions_, rank_,
                                    clock, weights_, &versions_, &r));
  AddPushResult(r);
  TakeStepStats(stats);
  return absl::OkStatus();
}

absl::Status PsExchange::FinishPrefetched(int64_t clock, StepStats* stats) {
  // The previous step's PushPull; its answer is the next weights.
  RETURN_IF_ERROR(queue_.Drain());
  // This step's gradients came from the weights (and versions) in use now.
  sent_grads_ = *grads_;
  sent_versions_ = versions_;
  AdoptStaged();
  queue_.Enqueue([this, clock] {
    PushResult r;
    RETURN_IF_ERROR(client_->PushPull(all_tensors_, sent_grads_, sent_versions_,
                                      rank_, clock, &staged_, &staged_versions_,
                                      &r));
    AddPushResult(r);
    return absl::OkStatus();
  });
  in_flight_ = true;
  TakeStepStats(stats);
  return absl::OkStatus();
}

absl::Status PsExchange::Finish(int64_t clock) {
  (void)clock;
  RETURN_IF_ERROR(queue_.Drain());
  AdoptStaged();
  return absl::OkStatus();
}

}  // namespace asyncps
