// A worker's own Prometheus metrics (ps_worker --metrics_port): its steps
// as the trainer reports them, its traffic with the servers, and, for the
// evaluator, the test accuracy and loss. Thread-safe: the trainer and the
// evaluator update it, scrapes read it, on different threads.
#ifndef ASYNCPS_WORKER_WORKER_METRICS_H_
#define ASYNCPS_WORKER_WORKER_METRICS_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "client/ps_client.h"
#include "prometheus/collectable.h"
#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "worker/trainer.h"

namespace asyncps {

class WorkerMetrics final : public prometheus::Collectable {
 public:
  // A training worker's: every series carries `rank`.
  explicit WorkerMetrics(int rank);
  // The evaluator's: accuracy, loss, updates, evaluations, traffic.
  static std::shared_ptr<WorkerMetrics> ForEvaluator();

  // What the client moved, read at each scrape from now on.
  void SetTraffic(std::function<Traffic()> traffic);

  // One training step ended (TrainerConfig::on_step).
  void Step(const StepReport& report);
  // The samples/s of the last second or so.
  void SetRate(double samples_per_second);
  // The evaluator scored the test set.
  void Evaluated(double accuracy, double loss, double updates);

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  mutable absl::Mutex mu_;
  std::function<Traffic()> traffic_ ABSL_GUARDED_BY(mu_);

  WorkerMetrics(int rank, bool evaluator);

  // Constant after construction (the metrics lock themselves).
  const bool evaluator_;
  const std::string rank_;
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Counter& samples_;
  prometheus::Counter& steps_;
  prometheus::Counter& dropped_;
  prometheus::Gauge& rate_;
  prometheus::Gauge& loss_;
  prometheus::Gauge& clock_;
  prometheus::Gauge& staleness_;
  prometheus::Family<prometheus::Histogram>& phases_;
  prometheus::Histogram& data_;
  prometheus::Histogram& compute_;
  prometheus::Histogram& exchange_;
  prometheus::Gauge& accuracy_;
  prometheus::Gauge& test_loss_;
  prometheus::Gauge& updates_;
  prometheus::Counter& evaluations_;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_WORKER_METRICS_H_
