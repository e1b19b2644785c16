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
#include "absl/time/clock.h"
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

}  // namespace

absl::Status Train(const TrainerConfig& config, Mlp* model, DataLoader* loader,
                   GradientExchange* exchange, const std::atomic<bool>* stop,
                   TrainerResult* result) {
  std::vector<std::vector<float>> weights;
  for (size_t n : model->TensorSizes()) weights.emplace_back(n, 0.0f);
  RETURN_IF_ERROR(exchange->Start(&weights, config.start_clock));

  const absl::Time start = absl::Now();
  absl::Time last_log = start;
  int64_t samples_at_log = 0;
  std::vector<double> first;
  std::deque<double> recent;
  double window_loss = 0;
  int64_t window_steps = 0, window_staleness = 0, window_slices = 0;
  int64_t total_staleness = 0, total_slices = 0;
  std::vector<float> x;
  std::vector<int> y;
  *result = TrainerResult();

  int64_t step = 0;                         // Steps done by this process.
  int64_t done_clock = config.start_clock;  // Steps done by this rank.
  while (!stop->load(std::memory_order_relaxed)) {
    if (config.steps > 0 && done_clock >= config.steps) break;
    if (loader->epoch() >= config.epochs) break;
    model->SetWeights(weights);
    double loss = 0;
    const int64_t clock = done_clock + 1;
    const absl::Time compute_start = absl::Now();
    absl::Duration data_time;
    int64_t step_samples = 0;
    Timeline* const timeline = config.timeline;
    for (int m = 0; m < config.accumulate; ++m) {
      const absl::Time data_start = absl::Now();
      const int n = loader->NextBatch(config.batch_size, &x, &y);
      const absl::Time data_end = absl::Now();
      data_time += data_end - data_start;
      if (timeline != nullptr) {
        timeline->Span("data", "data", data_start, data_end, {{"examples", n}});
      }
      step_samples += n;
      const bool last = m + 1 == config.accumulate;
      // The compute span so far: forward and the backward of the layers
      // done, cut at each layer whose gradient is ready.
      absl::Time segment = data_end;
      bool forward = true;
      Mlp::LayerDone done;
      if (last) {
        done = [&](int layer) {
          if (timeline != nullptr) {
            const absl::Time now = absl::Now();
            timeline->Span(forward ? "forward, backward" : "backward",
                           "compute", segment, now,
                           {{"layer", layer}, {"step", clock}});
            segment = now;
            forward = false;
          }
          exchange->LayerReady(layer, model->grads(), clock);
        };
      }
      loss += model->TrainStep(x.data(), y.data(), n, 1.0f / config.accumulate,
                               m > 0, done) /
              config.accumulate;
      if (timeline != nullptr && !last) {
        timeline->Span("forward, backward", "compute", segment, absl::Now(),
                       {{"micro_batch", m}, {"step", clock}});
      }
      result->samples += n;
    }
    if (config.slowdown > 1.0) {
      // A simulated straggler: its compute takes `slowdown` times as long.
      const absl::Time sleep_start = absl::Now();
      absl::SleepFor((sleep_start - compute_start) * (config.slowdown - 1.0));
      if (timeline != nullptr) {
        timeline->Span("slowdown", "compute", sleep_start, absl::Now(),
                       {{"step", clock}});
      }
    }
    if (!std::isfinite(loss)) {
      return absl::InternalError(absl::StrFormat(
          "rank %d: loss is %f at step %d; lower the learning rate",
          config.rank, loss, step));
    }
    StepStats stats;
    const absl::Time exchange_start = absl::Now();
    RETURN_IF_ERROR(exchange->FinishStep(clock, &weights, &stats));
    if (timeline != nullptr) {
      timeline->Span("wait for exchange", "wait", exchange_start, absl::Now(),
                     {{"step", clock}});
    }
    ++step;
    // Where the exchange says the job is (StepStats::next_clock).
    done_clock = stats.next_clock >= 0 ? stats.next_clock : clock;
    if (config.clock != nullptr) config.clock->store(done_clock);
    if (config.on_step) {
      StepReport report;
      report.samples = step_samples;
      report.loss = loss;
      report.data_seconds = absl::ToDoubleSeconds(data_time);
      report.compute_seconds =
          absl::ToDoubleSeconds(exchange_start - compute_start - data_time);
      report.exchange_seconds =
          absl::ToDoubleSeconds(absl::Now() - exchange_start);
      report.dropped = stats.dropped;
      report.clock = done_clock;
      report.staleness = stats.slices_pushed > 0
                             ? static_cast<double>(stats.total_staleness) /
                                   static_cast<double>(stats.slices_pushed)
                             : 0.0;
      config.on_step(report);
    }
    const bool budget_spent = config.stop_at_version > 0 &&
                              stats.min_version >= config.stop_at_version;
    if (first.size() < 10) first.push_back(loss);
    recent.push_back(loss);
    if (recent.size() > 10) recent.pop_front();
    window_loss += loss;
    ++window_steps;
    window_staleness += stats.total_staleness;
    window_slices += stats.slices_pushed;
    total_staleness += stats.total_staleness;
    total_slices += stats.slices_pushed;
    result->dropped += stats.dropped;

    const absl::Time now = absl::Now();
    if (now - last_log >= config.log_every) {
      const double secs = absl::ToDoubleSeconds(now - last_log);
      const double rate = (result->samples - samples_at_log) / secs;
      std::printf(
          "rank %d step %lld epoch %lld loss %.4f samples/s %.0f staleness "
          "%.2f clock %lld eta %s\n",
          config.rank, static_cast<long long>(step),
          static_cast<long long>(loader->epoch()), window_loss / window_steps,
          rate,
          window_slices ? static_cast<double>(window_staleness) / window_slices
                        : 0.0,
          static_cast<long long>(done_clock),
          Eta(config, *loader, done_clock, step_samples, rate).c_str());
      std::fflush(stdout);
      last_log = now;
      samples_at_log = result->samples;
      window_loss = 0;
      window_steps = window_staleness = window_slices = 0;
    }
    if (budget_spent) break;
  }
  RETURN_IF_ERROR(exchange->Finish(done_clock));
  result->steps = step;
  result->weights_checksum = WeightsChecksum(weights);
  result->seconds = absl::ToDoubleSeconds(absl::Now() - start);
  if (!first.empty()) {
    result->first_loss =
        std::accumulate(first.begin(), first.end(), 0.0) / first.size();
    result->last_loss =
        std::accumulate(recent.begin(), recent.end(), 0.0) / recent.size();
  }
  result->mean_staleness =
      total_slices ? static_cast<double>(total_staleness) / total_slices : 0;
  return absl::OkStatus();
}

}  // namespace asyncps
