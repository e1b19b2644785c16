#include "worker/ps_exchange.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace asyncps {

PsExchange::PsExchange(PsClient* client, int rank,
                       std::vector<std::vector<int>> layer_tensors, Mode mode,
                       bool steps)
    : client_(client),
      rank_(rank),
      layer_tensors_(std::move(layer_tensors)),
      all_tensors_(AllTensors(layer_tensors_)),
      mode_(mode),
      steps_(steps) {}

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
  if (r.dropped > 0) {
    // One below the newest step applied anywhere, as a rejoining worker
    // resumes: that step may still wait on some slices for this worker's
    // gradient (it counts as live again), which its next push brings.
    step_stats_.next_clock = std::max(step_stats_.next_clock, r.front_step - 1);
  }
}

absl::Status PsExchange::Recover(const absl::Status& failure) {
  if (failure.code() != absl::StatusCode::kFailedPrecondition) return failure;
  ASSIGN_OR_RETURN(const std::vector<int> lost, client_->ShardsWithoutModel());
  if (lost.empty()) {
    // Another worker may have declared the model again meanwhile: then a
    // shard's incarnation is not the one our weights came from.
    std::vector<std::vector<float>> fresh = *weights_;
    std::vector<SliceVersion> fresh_versions;
    RETURN_IF_ERROR(
        client_->Pull(all_tensors_, &fresh, &fresh_versions, -1, 0));
    bool restarted = false;
    for (size_t i = 0; i < versions_.size() && i < fresh_versions.size(); ++i) {
      restarted |= versions_[i].incarnation != 0 &&
                   versions_[i].incarnation != fresh_versions[i].incarnation;
    }
    if (!restarted) return failure;
    weights_->swap(fresh);
    versions_.swap(fresh_versions);
    return absl::OkStatus();
  }
  for (int shard : lost) {
    ASSIGN_OR_RETURN(const bool created, client_->Redeclare(shard));
    if (!created) continue;  // Another worker restores it.
    LOG(WARNING) << "shard " << shard
                 << " restarted without the model: restoring it from rank "
                 << rank_ << "'s copy";
    absl::Status restored =
        client_->Restore(shard, *weights_, versions_, rank_);
    // FAILED_PRECONDITION: the shard stopped waiting (--restore_wait).
    if (!restored.ok() &&
        restored.code() != absl::StatusCode::kFailedPrecondition) {
      return restored;
    }
  }
  // As no worker (rank -1): a restored shard's steps and clocks must not
  // hold this pull.
  return client_->Pull(all_tensors_, weights_, &versions_, -1, 0);
}

absl::Status PsExchange::PullLayer(const std::vector<int>& tensors,
                                   const std::vector<std::vector<float>>& grads,
                                   int64_t clock) {
  absl::Status s = client_->Pull(tensors, weights_, &versions_, rank_, clock);
  if (s.code() != absl::StatusCode::kAborted) return s;
  // The shard restarted after our push may have reached it: push again
  // (dropped if it had), then wait for the step as usual.
  PushResult r;
  RETURN_IF_ERROR(client_->Push(tensors, grads, versions_, rank_, clock, &r));
  for (int t : tensors) {
    for (int i : client_->partition().tensor_slices(t)) {
      versions_[i].incarnation = 0;
    }
  }
  return client_->Pull(tensors, weights_, &versions_, rank_, clock);
}

void PsExchange::LayerReady(int layer,
                            const std::vector<std::vector<float>>& grads,
                            int64_t clock) {
  grads_ = &grads;  // Sent whole at FinishStep (or again, after a failure).
  if (mode_ != Mode::kLayered) return;
  const std::vector<int>* tensors = &layer_tensors_[layer];
  queue_.Enqueue([this, tensors, &grads, clock] {
    PushResult r;
    RETURN_IF_ERROR(
        client_->Push(*tensors, grads, versions_, rank_, clock, &r));
    AddPushResult(r);
    return absl::OkStatus();
  });
  queue_.Enqueue([this, tensors, &grads, clock] {
    return PullLayer(*tensors, grads, clock);
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
  if (!versions_.empty()) {
    step_stats_.min_version = versions_[0].version;
    for (const SliceVersion& v : versions_) {
      step_stats_.min_version = std::min(step_stats_.min_version, v.version);
    }
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

absl::Status PsExchange::FinishLayered(int64_t clock, StepStats* stats) {
  absl::Status s = queue_.Drain();
  if (!s.ok()) {
    s = Recover(s);
    if (s.ok() && steps_) {
      // bsp: the step broke off part-way, and a step is applied only once
      // every worker's gradient has reached every slice: send all of it
      // again (a slice that has this worker's gradient drops the copy) and
      // wait for the step's weights as usual.
      PushResult r;
      s = client_->Push(all_tensors_, *grads_, versions_, rank_, clock, &r);
      if (s.ok()) {
        AddPushResult(r);
        s = PullLayer(all_tensors_, *grads_, clock);
      }
    }
  }
  TakeStepStats(stats);
  return s;
}

absl::Status PsExchange::FinishFused(int64_t clock, StepStats* stats) {
  PushResult r;
  absl::Status s = client_->PushPull(all_tensors_, *grads_, versions_, rank_,
                                     clock, weights_, &versions_, &r);
  if (s.ok()) {
    AddPushResult(r);
  } else {
    RETURN_IF_ERROR(Recover(s));
  }
  TakeStepStats(stats);
  return absl::OkStatus();
}

absl::Status PsExchange::FinishPrefetched(int64_t clock, StepStats* stats) {
  // The previous step's PushPull; its answer is the next weights.
  if (absl::Status s = queue_.Drain(); !s.ok()) {
    in_flight_ = false;  // Its answer never came.
    RETURN_IF_ERROR(Recover(s));
  }
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
  if (absl::Status s = queue_.Drain(); !s.ok()) {
    in_flight_ = false;
    RETURN_IF_ERROR(Recover(s));
  }
  AdoptStaged();
  return absl::OkStatus();
}

}  // namespace asyncps
