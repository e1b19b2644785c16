#include "worker/local_steps_exchange.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/status_macros.h"

namespace asyncps {

int DynamicRoundSteps(int local_steps, double mine, double fastest) {
  if (!(mine > 0) || !(fastest > 0)) return local_steps;
  const double scaled = std::round(local_steps * mine / fastest);
  return static_cast<int>(
      std::clamp(scaled, 1.0, static_cast<double>(local_steps)));
}

LocalStepsExchange::LocalStepsExchange(
    const LocalStepsConfig& config, std::unique_ptr<GradientExchange> servers,
    std::vector<std::vector<int>> layer_tensors)
    : config_(config),
      servers_(std::move(servers)),
      layer_tensors_(std::move(layer_tensors)) {}

absl::Status LocalStepsExchange::Start(std::vector<std::vector<float>>* weights,
                                       int64_t clock) {
  answer_ = *weights;  // Sized as the model's tensors.
  round_ = clock / config_.local_steps;
  RETURN_IF_ERROR(servers_->Start(&answer_, round_));
  round_steps_ = config_.local_steps;
  done_ = 0;
  round_start_ = config_.clock->Now();
  *weights = answer_;
  anchor_ = answer_;
  pushed_ = answer_;
  slots_.clear();
  for (const std::vector<float>& w : *weights) {
    slots_.emplace_back(config_.inner, w.size());
  }
  return absl::OkStatus();
}

int64_t LocalStepsExchange::resumed_clock() const {
  const int64_t round = servers_->resumed_clock();
  return round < 0 ? round : round * config_.local_steps;
}

void LocalStepsExchange::LayerReady(
    int layer, const std::vector<std::vector<float>>& grads, int64_t clock) {
  grads_ = &grads;  // Applied here once the step is complete.
}

absl::Status LocalStepsExchange::FinishStep(
    int64_t clock, std::vector<std::vector<float>>* weights, StepStats* stats) {
  if (grads_ == nullptr) {
    return absl::FailedPreconditionError("a step finished with no gradient");
  }
  for (size_t t = 0; t < weights->size(); ++t) {
    slots_[t].Apply(config_.inner, 1.0f, (*grads_)[t],
                    absl::MakeSpan((*weights)[t]));
  }
  grads_ = nullptr;
  if (++done_ < round_steps_) return absl::OkStatus();
  RETURN_IF_ERROR(Exchange(++round_, weights, stats));
  const absl::Time now = config_.clock->Now();
  const double seconds = absl::ToDoubleSeconds(now - round_start_);
  if (config_.dynamic && config_.fastest && seconds > 0) {
    round_steps_ = DynamicRoundSteps(config_.local_steps, done_ / seconds,
                                     config_.fastest());
  }
  done_ = 0;
  round_start_ = now;
  return absl::OkStatus();
}

absl::Status LocalStepsExchange::Exchange(
    int64_t round, std::vector<std::vector<float>>* weights, StepStats* stats) {
  for (size_t t = 0; t < weights->size(); ++t) {
    const std::vector<float>& w = (*weights)[t];
    std::vector<float>& p = pushed_[t];
    for (size_t i = 0; i < w.size(); ++i) {
      p[i] = config_.outer == LocalStepsConfig::kDiloco ? anchor_[t][i] - w[i]
                                                        : w[i];
    }
  }
  for (size_t layer = 0; layer < layer_tensors_.size(); ++layer) {
    servers_->LayerReady(static_cast<int>(layer), pushed_, round);
  }
  RETURN_IF_ERROR(servers_->FinishStep(round, &answer_, stats));
  if (stats->next_clock >= 0) {  // bsp: the job is further on.
    round_ = stats->next_clock;
    stats->next_clock *= config_.local_steps;
  }
  if (config_.outer == LocalStepsConfig::kEasgd) {
    // x -= alpha / (1 - alpha) * (x - centre): alpha * (x - the centre the
    // push met).
    const float share = config_.alpha / (1.0f - config_.alpha);
    for (size_t t = 0; t < weights->size(); ++t) {
      std::vector<float>& w = (*weights)[t];
      for (size_t i = 0; i < w.size(); ++i) {
        w[i] -= share * (w[i] - answer_[t][i]);
      }
    }
  } else {
    *weights = answer_;
  }
  anchor_ = *weights;
  return absl::OkStatus();
}

absl::Status LocalStepsExchange::Finish(int64_t clock) {
  return servers_->Finish(round_);
}

}  // namespace asyncps
