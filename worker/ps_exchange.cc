#include "worker/ps_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/backoff.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace asyncps {

PsExchange::PsExchange(Client* client,
                       std::vector<std::vector<int>> layer_tensors, Mode mode,
                       bool steps)
    : client_(client),
      layer_tensors_(std::move(layer_tensors)),
      all_tensors_(AllTensors(layer_tensors_)),
      mode_(mode),
      steps_(steps) {}

absl::Status PsExchange::ResolveTensors() {
  std::vector<std::string> names;  // By tensor index.
  for (const TensorSpec& t : client_->tensors()) names.push_back(t.name);
  auto resolve = [&names, this](const std::vector<int>& tensors) {
    std::vector<std::string> some;
    some.reserve(tensors.size());
    for (int t : tensors) some.push_back(names[t]);
    return client_->Resolve(some);
  };
  layer_sets_.clear();
  for (const std::vector<int>& layer : layer_tensors_) {
    ASSIGN_OR_RETURN(TensorSet set, resolve(layer));
    layer_sets_.push_back(std::move(set));
  }
  ASSIGN_OR_RETURN(all_set_, resolve(all_tensors_));
  return absl::OkStatus();
}

std::vector<absl::Span<float>> PsExchange::Out(
    const std::vector<int>& tensors, std::vector<std::vector<float>>* w) {
  std::vector<absl::Span<float>> out;
  out.reserve(tensors.size());
  for (int t : tensors) out.push_back(absl::MakeSpan((*w)[t]));
  return out;
}

std::vector<absl::Span<const float>> PsExchange::In(
    const std::vector<int>& tensors, const std::vector<std::vector<float>>& w) {
  std::vector<absl::Span<const float>> in;
  in.reserve(tensors.size());
  for (int t : tensors) in.push_back(absl::MakeConstSpan(w[t]));
  return in;
}

absl::Status PsExchange::Start(std::vector<std::vector<float>>* weights,
                               int64_t clock) {
  weights_ = weights;
  // The model's names become handles once: no lookup per step.
  RETURN_IF_ERROR(ResolveTensors());
  CallOptions pull;
  pull.step = clock;
  pull.into = &versions_;
  // No Recover here: this worker holds no weights from the servers yet,
  // and handing a shard that lost its model these would reset it (a chaos
  // sweep did: accuracy 0.10). A worker that holds trained weights
  // restores such a shard; only if none does is the model declared there
  // again, as new (set_lost_model_at_start).
  absl::Status s = client_->Pull(all_set_, AllWeights(), pull);
  if (s.code() == absl::StatusCode::kFailedPrecondition &&
      lost_at_start_.declare) {
    Backoff backoff(absl::Milliseconds(20), absl::Seconds(1),
                    lost_at_start_.wait);
    while (s.code() == absl::StatusCode::kFailedPrecondition &&
           backoff.Wait()) {
      s = client_->Pull(all_set_, AllWeights(), pull);
    }
    if (s.code() == absl::StatusCode::kFailedPrecondition) {
      LOG(WARNING) << "a shard lost the model before this worker's first "
                      "pull, and no worker restored it within "
                   << absl::FormatDuration(lost_at_start_.wait) << " ("
                   << s.message() << "): declaring it there again";
      RETURN_IF_ERROR(lost_at_start_.declare());
      RETURN_IF_ERROR(ResolveTensors());  // Handles of the model declared.
      s = client_->Pull(all_set_, AllWeights(), pull);
    }
  }
  RETURN_IF_ERROR(s);
  if (mode_ == Mode::kPrefetch) staged_ = *weights;  // Sized like them.
  return absl::OkStatus();
}

void PsExchange::AddPushStats(const PushStats& r) {
  step_stats_.pushed.Add(r);
  if (r.dropped > 0) {
    // One below the newest step applied anywhere, as a rejoining worker
    // resumes: that step may still wait on some slices for this worker's
    // gradient (it counts as live again), which its next push brings.
    step_stats_.next_clock = std::max(step_stats_.next_clock, r.front_step - 1);
  }
}

absl::Status PsExchange::Recover(const absl::Status& failure) {
  // A shard may lose its model again while another is being restored
  // (chaos: kills a second apart): a few tries.
  absl::Status s = failure;
  for (int attempt = 0; attempt < 3; ++attempt) {
    s = client_->Recover(s, AllWeights(), &versions_);
    if (s.code() != absl::StatusCode::kFailedPrecondition) break;
  }
  return s;
}

absl::Status PsExchange::PushTensors(
    const TensorSet& set, const std::vector<int>& tensors,
    const std::vector<std::vector<float>>& grads, int64_t clock, bool count,
    bool again) {
  PushStats r;
  CallOptions push;
  push.step = clock;
  push.from = &versions_;
  push.stats = &r;
  push.again = again;
  RETURN_IF_ERROR(client_->Push(set, In(tensors, grads), push));
  if (count) AddPushStats(r);
  return absl::OkStatus();
}

absl::Status PsExchange::PullLayer(const TensorSet& set,
                                   const std::vector<int>& tensors,
                                   const std::vector<std::vector<float>>& grads,
                                   int64_t clock) {
  CallOptions pull;
  pull.step = clock;
  pull.into = &versions_;
  pull.after_push = true;
  absl::Status s = client_->Pull(set, Out(tensors, weights_), pull);
  // ABORTED: the shard restarted after our push may have reached it, or it
  // lacks our gradient for the step: push again (dropped where it had
  // come), then wait for the step as usual.
  for (int again = 0; again < 3 && s.code() == absl::StatusCode::kAborted;
       ++again) {
    LOG(WARNING) << "step " << clock << ": " << s.message()
                 << "; pushing the step's gradient again";
    RETURN_IF_ERROR(PushAgain(set, tensors, grads, clock));
    pull.any_incarnation = true;
    s = client_->Pull(set, Out(tensors, weights_), pull);
  }
  return s;
}

absl::Status PsExchange::PushAgain(const TensorSet& set,
                                   const std::vector<int>& tensors,
                                   const std::vector<std::vector<float>>& grads,
                                   int64_t clock) {
  if (&set != &all_set_) {
    for (int layer : pushed_layers_) {
      if (&layer_sets_[layer] == &set) continue;  // Last, below.
      RETURN_IF_ERROR(PushTensors(layer_sets_[layer], layer_tensors_[layer],
                                  grads, clock, /*count=*/false,
                                  /*again=*/true));
    }
  }
  return PushTensors(set, tensors, grads, clock, /*count=*/false,
                     /*again=*/true);
}

void PsExchange::LayerReady(int layer,
                            const std::vector<std::vector<float>>& grads,
                            int64_t clock) {
  grads_ = &grads;  // Sent whole at FinishStep (or again, after a failure).
  if (mode_ != Mode::kLayered) return;
  const std::vector<int>* tensors = &layer_tensors_[layer];
  const TensorSet* set = &layer_sets_[layer];
  queue_.Enqueue([this, layer, set, tensors, &grads, clock] {
    RETURN_IF_ERROR(PushTensors(*set, *tensors, grads, clock, /*count=*/true));
    pushed_layers_.push_back(layer);
    return absl::OkStatus();
  });
  queue_.Enqueue([this, set, tensors, &grads, clock] {
    return PullLayer(*set, *tensors, grads, clock);
  });
}

absl::Status PsExchange::FinishStep(int64_t clock,
                                    std::vector<std::vector<float>>* weights,
                                    StepStats* stats) {
  // Either way the weights land in the buffer given to Start.
  (void)weights;
  absl::Status s;
  switch (mode_) {
    case Mode::kFused:
      s = FinishFused(clock, stats);
      break;
    case Mode::kPrefetch:
      s = FinishPrefetched(clock, stats);
      break;
    default:
      s = FinishLayered(clock, stats);
  }
  // Only a job ahead of this worker moves its clock.
  if (stats != nullptr && stats->next_clock <= clock) stats->next_clock = -1;
  return s;
}

void PsExchange::TakeStepStats(StepStats* stats) {
  const int64_t min_version = versions_.min_version();
  if (min_version >= 0) step_stats_.min_version = min_version;
  if (stats != nullptr) *stats = step_stats_;
  step_stats_ = StepStats();
  pushed_layers_.clear();
}

void PsExchange::AdoptStaged() {
  if (!in_flight_) return;
  weights_->swap(staged_);
  std::swap(versions_, staged_versions_);
  in_flight_ = false;
}

absl::Status PsExchange::RecoverStep(
    absl::Status s, const std::vector<std::vector<float>>& grads,
    int64_t clock) {
  for (int attempt = 0; attempt < 3 && !s.ok(); ++attempt) {
    s = Recover(s);  // Tries again itself.
    if (!s.ok() || !steps_) break;
    s = PushTensors(all_set_, all_tensors_, grads, clock, /*count=*/true,
                    /*again=*/true);
    if (s.ok()) s = PullLayer(all_set_, all_tensors_, grads, clock);
    if (s.code() != absl::StatusCode::kFailedPrecondition) break;
  }
  return s;
}

absl::Status PsExchange::FinishLayered(int64_t clock, StepStats* stats) {
  absl::Status s = queue_.Drain();
  if (!s.ok()) s = RecoverStep(std::move(s), *grads_, clock);
  TakeStepStats(stats);
  return s;
}

absl::Status PsExchange::FinishFused(int64_t clock, StepStats* stats) {
  PushStats r;
  CallOptions call;
  call.step = clock;
  call.from = &versions_;
  call.into = &versions_;
  call.stats = &r;
  // An ABORTED pull half (the gradient lost on the way) is pushed again by
  // the client itself (Client::PushPull).
  absl::Status s = client_->PushPull(all_set_, In(all_tensors_, *grads_),
                                     AllWeights(), call);
  if (s.ok()) {
    AddPushStats(r);
  } else {
    s = RecoverStep(std::move(s), *grads_, clock);
  }
  TakeStepStats(stats);
  return s;
}

absl::Status PsExchange::FinishPrefetched(int64_t clock, StepStats* stats) {
  // The previous step's PushPull; its answer is the next weights.
  if (absl::Status s = queue_.Drain(); !s.ok()) {
    in_flight_ = false;  // Its answer never came.
    RETURN_IF_ERROR(RecoverStep(std::move(s), sent_grads_, sent_clock_));
  }
  // This step's gradients came from the weights (and versions) in use now.
  sent_grads_ = *grads_;
  sent_clock_ = clock;
  sent_versions_ = versions_;
  AdoptStaged();
  queue_.Enqueue([this, clock] {
    PushStats r;
    CallOptions call;
    call.step = clock;
    call.from = &sent_versions_;
    call.into = &staged_versions_;
    call.stats = &r;
    RETURN_IF_ERROR(client_->PushPull(all_set_, In(all_tensors_, sent_grads_),
                                      Out(all_tensors_, &staged_), call));
    AddPushStats(r);
    return absl::OkStatus();
  });
  in_flight_ = true;
  TakeStepStats(stats);
  return absl::OkStatus();
}

absl::Status PsExchange::Finish(int64_t clock) {
  (void)clock;
  if (absl::Status s = queue_.Drain(); !s.ok()) {
    in_flight_ = false;
    RETURN_IF_ERROR(RecoverStep(std::move(s), sent_grads_, sent_clock_));
  }
  AdoptStaged();
  return absl::OkStatus();
}

}  // namespace asyncps
