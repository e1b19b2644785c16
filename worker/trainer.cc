#include "worker/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/hash.h"
#include "common/status.h"

namespace asyncps {

uint64_t WeightsChecksum(const std::vector<std::vector<float>>& weights) {
  uint64_t h = kFnv1aOffset;
  for (const auto& t : weights) {
    h = Fnv1a64(absl::string_view(reinterpret_cast<const char*>(t.data()),
                                  t.size() * sizeof(float)),
                h);
  }
  return h;
}

namespace {

// How long the rest of the run takes at `rate` samples/s: until --steps
// (steps of `step_samples`) or the last epoch, whichever comes first.
std::string Eta(const TrainerConfig& config, const DataLoader& loader,
                int64_t clock, int64_t step_samples, double rate) {
  double left = std::numeric_limits<double>::infinity();
  if (config.epochs < std::numeric_limits<int64_t>::max()) {
    left = static_cast<double>(
        (config.epochs - loader.epoch()) * loader.share() - loader.position());
  }
  if (config.steps > 0) {
    left = std::min(left, static_cast<double>(config.steps - clock) *
                              static_cast<double>(step_samples));
  }
  if (!(rate > 0) || !std::isfinite(left)) return "unknown";
  return absl::FormatDuration(
      absl::Seconds(std::ceil(std::max(0.0, left) / rate)));
}

// A span on the timeline, if there is one.
void Span(const TrainerConfig& config, const char* name, const char* category,
          absl::Time start, absl::Time end, Timeline::Args args) {
  if (config.timeline != nullptr) {
    config.timeline->Span(name, category, start, end, args);
  }
}

// What the compute part of one step did.
struct Computed {
  double loss = 0;  // Mean over the micro-batches.
  int64_t samples = 0;
  absl::Time start;
  absl::Duration data_time;  // Of it, reading the batches.
};

// Forward and backward of step `clock` over config.accumulate
// micro-batches; the last one hands each layer's gradient to `exchange` as
// soon as it is ready. `x` and `y` are reused batch buffers.
Computed Compute(const TrainerConfig& config, int64_t clock, Mlp* model,
                 DataLoader* loader, GradientExchange* exchange,
                 std::vector<float>* x, std::vector<int>* y) {
  Clock* const time = config.clock;
  Computed c;
  c.start = time->Now();
  for (int m = 0; m < config.accumulate; ++m) {
    const absl::Time data_start = time->Now();
    const int n = loader->NextBatch(config.batch_size, x, y);
    const absl::Time data_end = time->Now();
    c.data_time += data_end - data_start;
    Span(config, "data", "data", data_start, data_end, {{"examples", n}});
    c.samples += n;
    const bool last = m + 1 == config.accumulate;
    // The compute span so far: forward and the backward of the layers done,
    // cut at each layer whose gradient is ready.
    absl::Time segment = data_end;
    bool forward = true;
    Mlp::LayerDone done;
    if (last) {
      done = [&](int layer) {
        if (config.timeline != nullptr) {
          const absl::Time now = time->Now();
          Span(config, forward ? "forward, backward" : "backward", "compute",
               segment, now, {{"layer", layer}, {"step", clock}});
          segment = now;
          forward = false;
        }
        exchange->LayerReady(layer, model->grads(), clock);
      };
    }
    c.loss += model->TrainStep(x->data(), y->data(), n,
                               1.0f / config.accumulate, m > 0, done) /
              config.accumulate;
    if (!last) {
      Span(config, "forward, backward", "compute", segment, time->Now(),
           {{"micro_batch", m}, {"step", clock}});
    }
  }
  return c;
}

// --slowdown, a simulated straggler: its compute takes `slowdown` times as
// long (it sleeps the difference).
void Straggle(const TrainerConfig& config, int64_t clock,
              absl::Time compute_start) {
  if (config.slowdown <= 1.0) return;
  const absl::Time sleep_start = config.clock->Now();
  config.clock->SleepFor((sleep_start - compute_start) *
                         (config.slowdown - 1.0));
  Span(config, "slowdown", "compute", sleep_start, config.clock->Now(),
       {{"step", clock}});
}

// What the trainer has seen: the loss and staleness since the last log
// line and over the run, the progress line every config.log_every, and the
// result.
class RunProgress {
 public:
  RunProgress(const TrainerConfig& config, const DataLoader* loader)
      : config_(config),
        loader_(loader),
        start_(config.clock->Now()),
        last_log_(start_) {}

  // One step done: `done_clock` the rank's steps completed after it.
  void Add(const Computed& c, const StepStats& stats, int64_t done_clock) {
    ++steps_;
    samples_ += c.samples;
    if (first_.size() < 10) first_.push_back(c.loss);
    recent_.push_back(c.loss);
    if (recent_.size() > 10) recent_.pop_front();
    window_loss_ += c.loss;
    ++window_steps_;
    window_staleness_ += stats.pushed.total_staleness;
    window_slices_ += stats.pushed.slices;
    total_staleness_ += stats.pushed.total_staleness;
    total_slices_ += stats.pushed.slices;
    dropped_ += stats.pushed.dropped;
    MaybeLog(c.samples, done_clock);
  }

  void Fill(const std::vector<std::vector<float>>& weights,
            TrainerResult* result) const {
    result->steps = steps_;
    result->samples = samples_;
    result->dropped = dropped_;
    result->weights_checksum = WeightsChecksum(weights);
    result->seconds = absl::ToDoubleSeconds(config_.clock->Now() - start_);
    if (!first_.empty()) {
      result->first_loss =
          std::accumulate(first_.begin(), first_.end(), 0.0) / first_.size();
      result->last_loss =
          std::accumulate(recent_.begin(), recent_.end(), 0.0) / recent_.size();
    }
    result->mean_staleness =
        total_slices_ ? static_cast<double>(total_staleness_) / total_slices_
                      : 0;
  }

  int64_t steps() const { return steps_; }

 private:
  // The progress line, every config.log_every.
  void MaybeLog(int64_t step_samples, int64_t done_clock) {
    const absl::Time now = config_.clock->Now();
    if (now - last_log_ < config_.log_every) return;
    const double secs = absl::ToDoubleSeconds(now - last_log_);
    const double rate = (samples_ - samples_at_log_) / secs;
    std::printf(
        "rank %d step %lld epoch %lld loss %.4f samples/s %.0f staleness "
        "%.2f clock %lld eta %s\n",
        config_.rank, static_cast<long long>(steps_),
        static_cast<long long>(loader_->epoch()), window_loss_ / window_steps_,
        rate,
        window_slices_ ? static_cast<double>(window_staleness_) / window_slices_
                       : 0.0,
        static_cast<long long>(done_clock),
        Eta(config_, *loader_, done_clock, step_samples, rate).c_str());
    std::fflush(stdout);
    last_log_ = now;
    samples_at_log_ = samples_;
    window_loss_ = 0;
    window_steps_ = window_staleness_ = window_slices_ = 0;
  }

  const TrainerConfig& config_;
  const DataLoader* const loader_;
  const absl::Time start_;
  absl::Time last_log_;
  int64_t steps_ = 0, samples_ = 0, samples_at_log_ = 0, dropped_ = 0;
  std::vector<double> first_;
  std::deque<double> recent_;
  double window_loss_ = 0;
  int64_t window_steps_ = 0, window_staleness_ = 0, window_slices_ = 0;
  int64_t total_staleness_ = 0, total_slices_ = 0;
};

// The step as the worker's progress reports see it.
StepReport Report(const Computed& c, const StepStats& stats,
                  absl::Time exchange_start, absl::Time exchange_end,
                  int64_t done_clock) {
  StepReport report;
  report.samples = c.samples;
  report.loss = c.loss;
  report.data_seconds = absl::ToDoubleSeconds(c.data_time);
  report.compute_seconds =
      absl::ToDoubleSeconds(exchange_start - c.start - c.data_time);
  report.exchange_seconds =
      absl::ToDoubleSeconds(exchange_end - exchange_start);
  report.clock = done_clock;
  report.pushed = stats.pushed;
  return report;
}

}  // namespace

absl::Status Train(const TrainerConfig& config, Mlp* model, DataLoader* loader,
                   GradientExchange* exchange, const std::atomic<bool>* stop,
                   TrainerResult* result) {
  std::vector<std::vector<float>> weights;
  for (size_t n : model->TensorSizes()) weights.emplace_back(n, 0.0f);
  RETURN_IF_ERROR(exchange->Start(&weights, config.start_clock));
  // Steps done by this rank: where it resumes, or where the exchange found
  // the job (the loader follows it there).
  int64_t done_clock = config.start_clock;
  if (exchange->resumed_clock() >= 0) {
    done_clock = exchange->resumed_clock();
    if (done_clock > config.start_clock) {
      loader->Skip((done_clock - config.start_clock) * config.accumulate,
                   config.batch_size);
    }
    if (config.steps_done != nullptr) {
      config.steps_done->store(done_clock / config.local_steps);
    }
  }
  *result = TrainerResult();
  RunProgress progress(config, loader);
  std::vector<float> x;
  std::vector<int> y;
  while (!stop->load(std::memory_order_relaxed) || exchange->StepToLeave()) {
    if (config.steps > 0 && done_clock >= config.steps) break;
    if (loader->epoch() >= config.epochs) break;
    model->SetWeights(weights);
    const int64_t clock = done_clock + 1;
    const Computed c = Compute(config, clock, model, loader, exchange, &x, &y);
    Straggle(config, clock, c.start);
    if (!std::isfinite(c.loss)) {
      return absl::InternalError(absl::StrFormat(
          "rank %d: loss is %f at step %d; lower the learning rate",
          config.rank, c.loss, progress.steps()));
    }
    StepStats stats;
    const absl::Time exchange_start = config.clock->Now();
    RETURN_IF_ERROR(exchange->FinishStep(clock, &weights, &stats));
    const absl::Time exchange_end = config.clock->Now();
    Span(config, "wait for exchange", "wait", exchange_start, exchange_end,
         {{"step", clock}});
    // Where the exchange says the job is (StepStats::next_clock).
    done_clock = stats.next_clock >= 0 ? stats.next_clock : clock;
    if (config.steps_done != nullptr) {
      config.steps_done->store(done_clock / config.local_steps);
    }
    if (config.on_step) {
      config.on_step(
          Report(c, stats, exchange_start, exchange_end, done_clock));
    }
    progress.Add(c, stats, done_clock);
    if (config.stop_at_version > 0 &&
        stats.min_version >= config.stop_at_version) {
      break;  // The shared budget of updates is spent.
    }
  }
  RETURN_IF_ERROR(exchange->Finish(done_clock));
  progress.Fill(weights, result);
  return absl::OkStatus();
}

}  // namespace asyncps
