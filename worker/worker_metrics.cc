#include "worker/worker_metrics.h"

#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/metric_families.h"

namespace asyncps {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

// Seconds per step phase, 100 µs to about 30 s, four buckets per decade.
prometheus::Histogram::BucketBoundaries PhaseBuckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 1e-4; s < 40; s *= 1.778279) b.push_back(s);
  return b;
}

prometheus::MetricFamily Counter(const char* name, const char* help,
                                 const std::string& rank, int64_t value) {
  return OneSample(name, help, prometheus::MetricType::Counter,
                   static_cast<double>(value), {{"rank", rank}});
}

}  // namespace

WorkerMetrics::WorkerMetrics(int rank) : WorkerMetrics(rank, false) {}

std::shared_ptr<WorkerMetrics> WorkerMetrics::ForEvaluator() {
  return std::shared_ptr<WorkerMetrics>(new WorkerMetrics(-1, true));
}

WorkerMetrics::WorkerMetrics(int rank, bool evaluator)
    : evaluator_(evaluator),
      rank_(evaluator ? "evaluator" : absl::StrCat(rank)),
      registry_(std::make_shared<prometheus::Registry>()),
      samples_(BuildCounter()
                   .Name("asyncps_worker_samples_total")
                   .Help("Examples this worker process trained on.")
                   .Register(*registry_)
                   .Add({{"rank", rank_}})),
      steps_(BuildCounter()
                 .Name("asyncps_worker_steps_total")
                 .Help("Steps (pushes) this worker process made.")
                 .Register(*registry_)
                 .Add({{"rank", rank_}})),
      dropped_(BuildCounter()
                   .Name("asyncps_worker_dropped_gradients_total")
                   .Help("Slice gradients the servers did not apply (too "
                         "stale, late for their bsp step, or from a shard "
                         "that restarted).")
                   .Register(*registry_)
                   .Add({{"rank", rank_}})),
      rate_(BuildGauge()
                .Name("asyncps_worker_samples_per_second")
                .Help("Training rate over the last second or so.")
                .Register(*registry_)
                .Add({{"rank", rank_}})),
      loss_(BuildGauge()
                .Name("asyncps_worker_loss")
                .Help("Training loss of the last step.")
                .Register(*registry_)
                .Add({{"rank", rank_}})),
      clock_(BuildGauge()
                 .Name("asyncps_worker_clock")
                 .Help("The rank's clock: steps done, counting those before "
                       "a restart.")
                 .Register(*registry_)
                 .Add({{"rank", rank_}})),
      staleness_(BuildGauge()
                     .Name("asyncps_worker_staleness")
                     .Help("Versions applied between the last step's pull and "
                           "its push, mean over its slices.")
                     .Register(*registry_)
                     .Add({{"rank", rank_}})),
      phases_(BuildHistogram()
                  .Name("asyncps_worker_step_phase_seconds")
                  .Help("Time per step phase: data (reading minibatches), "
                        "compute (forward and backward; pushes of finished "
                        "layers overlap it), exchange (waiting for the "
                        "servers' answers, or the ring, after the last "
                        "layer).")
                  .Register(*registry_)),
      data_(phases_.Add({{"rank", rank_}, {"phase", "data"}}, PhaseBuckets())),
      compute_(
          phases_.Add({{"rank", rank_}, {"phase", "compute"}}, PhaseBuckets())),
      exchange_(phases_.Add({{"rank", rank_}, {"phase", "exchange"}},
                            PhaseBuckets())),
      accuracy_(BuildGauge()
                    .Name("asyncps_evaluator_accuracy")
                    .Help("Evaluator: fraction of the test set classified "
                          "right, at the last evaluation.")
                    .Register(*registry_)
                    .Add({})),
      test_loss_(BuildGauge()
                     .Name("asyncps_evaluator_loss")
                     .Help("Evaluator: mean test loss at the last evaluation.")
                     .Register(*registry_)
                     .Add({})),
      updates_(BuildGauge()
                   .Name("asyncps_evaluator_model_updates")
                   .Help("Evaluator: whole-model updates the servers had "
                         "applied when it last pulled.")
                   .Register(*registry_)
                   .Add({})),
      evaluations_(BuildCounter()
                       .Name("asyncps_evaluator_evaluations_total")
                       .Help("Evaluator: evaluations done.")
                       .Register(*registry_)
                       .Add({})) {}

void WorkerMetrics::Step(const StepReport& r) {
  samples_.Increment(static_cast<double>(r.samples));
  steps_.Increment();
  dropped_.Increment(static_cast<double>(r.pushed.dropped));
  loss_.Set(r.loss);
  clock_.Set(static_cast<double>(r.clock));
  staleness_.Set(r.pushed.MeanStaleness());
  data_.Observe(r.data_seconds);
  compute_.Observe(r.compute_seconds);
  exchange_.Observe(r.exchange_seconds);
}

void WorkerMetrics::SetTraffic(std::function<Traffic()> traffic) {
  absl::MutexLock lock(&mu_);
  traffic_ = std::move(traffic);
}

void WorkerMetrics::SetRate(double samples_per_second) {
  rate_.Set(samples_per_second);
}

void WorkerMetrics::Evaluated(double accuracy, double loss, double updates) {
  accuracy_.Set(accuracy);
  test_loss_.Set(loss);
  updates_.Set(updates);
  evaluations_.Increment();
}

std::vector<prometheus::MetricFamily> WorkerMetrics::Collect() const {
  // One registry holds both roles' families; each role shows its own.
  std::vector<prometheus::MetricFamily> out;
  for (auto& f : registry_->Collect()) {
    if (absl::StartsWith(f.name, "asyncps_evaluator_") == evaluator_) {
      out.push_back(std::move(f));
    }
  }
  std::function<Traffic()> traffic;
  {
    absl::MutexLock lock(&mu_);
    traffic = traffic_;
  }
  if (traffic) {
    const Traffic t = traffic();
    out.push_back(
        Counter("asyncps_worker_sent_bytes_total",
                "Bytes of tensor requests (push, pull, push-pull) sent to the "
                "servers.",
                rank_, t.sent_bytes));
    out.push_back(Counter("asyncps_worker_received_bytes_total",
                          "Bytes of the servers' answers to them.", rank_,
                          t.received_bytes));
    out.push_back(
        Counter("asyncps_worker_retries_total",
                "Calls to a shard tried again (UNAVAILABLE, or a timeout).",
                rank_, t.retries));
  }
  return out;
}

}  // namespace asyncps
