// The evaluator role: pulls the weights on a period, scores the test set,
// prints the accuracy and appends a row to a CSV curve.
#ifndef ASYNCPS_WORKER_EVALUATOR_H_
#define ASYNCPS_WORKER_EVALUATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "asyncps/client.h"
#include "worker/backend.h"
#include "worker/data/idx_reader.h"
#include "worker/model/mlp.h"
#include "worker/worker_config.h"
#include "worker/worker_metrics.h"

namespace asyncps {

struct Evaluation {
  double seconds = 0;   // Since the evaluator started.
  double updates = 0;   // Whole-model updates applied on the servers
                        // (slice updates / slices).
  double loss = 0;      // Mean test loss.
  double accuracy = 0;  // Fraction of the test set classified right.
};

// Pulls the current weights and scores `test` once. `client` has the model.
absl::StatusOr<Evaluation> EvaluateOnce(Client* client, Mlp* model,
                                        const Dataset& test, absl::Time start);

// Appends one row "seconds,updates,test_loss,test_accuracy" to `path`,
// writing the header first if the file is new or empty.
absl::Status AppendCurveRow(const std::string& path, const Evaluation& e);

// Whether every worker of the job has finished (the shards' Stats say so),
// for --until_done.
using JobDone = std::function<absl::StatusOr<bool>()>;

// Evaluates every `every` until `stop` is notified, or until `done` (if
// given) says the job is done before a pull; then once more (the final
// figure, returned). Prints each evaluation; appends to `curve` if not
// empty. `metrics` (may be null) is told each evaluation.
absl::StatusOr<Evaluation> RunEvaluator(
    Client* client, Mlp* model, const Dataset& test, absl::Duration every,
    const std::string& curve, absl::Notification* stop,
    WorkerMetrics* metrics = nullptr, const JobDone& done = nullptr);

// ps_worker --role=evaluator: adopts the model the workers declared (waiting
// for one), then scores `test` once (--eval_once, printing one line) or
// every --eval_every until `stop` (or, with --until_done, until `done` says
// the job is done: then the final model); writes the last evaluation to
// --result_json (JSON: role, seconds, updates, test_loss, accuracy) if
// given. Pointers are borrowed; `test` may be cut to --max_test_examples.
// `config` comes from WorkerConfig::Parse.
absl::Status RunEvaluatorRole(const WorkerConfig& config, Client* client,
                              Backend* backend, Dataset* test,
                              absl::Notification* stop,
                              WorkerMetrics* metrics = nullptr,
                              const JobDone& done = nullptr);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_EVALUATOR_H_
