#include "worker/ps_exchange.h"

#include <algorithm>

namespace asyncps {

PsExchange::PsExchange(PsClient* client, int rank,
                       std::vector<std::vector<int>> layer_tensors)
    : client_(client),
      rank_(rank),
      layer_tensors_(std::move(layer_tensors)),
      thread_([this] { Run(); }) {}

PsExchange::~PsExchange() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void PsExchange::Run() {
  while (true) {
    std::function<absl::Status()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](PsExchange* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return self->stop_ || !self->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // stop_ and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
    }
    // After an error the remaining tasks of the step are skipped.
    bool skip;
    {
      absl::MutexLock lock(&mu_);
      skip = !error_.ok();
    }
    absl::Status s = skip ? absl::OkStatus() : task();
    absl::MutexLock lock(&mu_);
    --running_;
    if (!s.ok() && error_.ok()) error_ = s;
  }
}

void PsExchange::Enqueue(std::function<absl::Status()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

absl::Status PsExchange::Start(std::vector<std::vector<float>>* weights) {
  std::vector<int> all;
  for (const auto& l : layer_tensors_)
    all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  weights_ = weights;
  return client_->Pull(all, weights, &versions_, rank_, 0);
}

void PsExchange::LayerReady(int layer,
                            const std::vector<std::vector<float>>& grads,
                            int64_t clock) {
  const std::vector<int>* tensors = &layer_tensors_[layer];
  Enqueue([this, tensors, &grads, clock] {
    PushResult r;
    absl::Status s =
        client_->Push(*tensors, grads, versions_, rank_, clock, &r);
    if (!s.ok()) return s;
    step_stats_.slices_pushed += r.slices;
    step_stats_.total_staleness += r.total_staleness;
    step_stats_.max_staleness =
        std::max(step_stats_.max_staleness, r.max_staleness);
    return absl::OkStatus();
  });
  Enqueue([this, tensors, clock] {
    return client_->Pull(*tensors, weights_, &versions_, rank_, clock);
  });
}

absl::Status PsExchange::FinishStep(int64_t clock,
                                    std::vector<std::vector<float>>* weights,
                                    StepStats* stats) {
  // The pulls queued by LayerReady write into the buffer given to Start.
  (void)weights;
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](PsExchange* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
        return self->tasks_.empty() && self->running_ == 0;
      },
      this));
  if (stats != nullptr) *stats = step_stats_;
  step_stats_ = StepStats();
  absl::Status s = error_;
  error_ = absl::OkStatus();
  return s;
}

}  // namespace asyncps
