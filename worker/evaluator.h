// The evaluator role: pulls the weights on a period, scores the test set,
// prints the accuracy and appends a row to a CSV curve.
#ifndef ASYNCPS_WORKER_EVALUATOR_H_
#define ASYNCPS_WORKER_EVALUATOR_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "worker/data/idx_reader.h"
#include "worker/model/mlp.h"
#include "worker/ps_client.h"

namespace asyncps {

struct Evaluation {
  double seconds = 0;   // Since the evaluator started.
  double updates = 0;   // Whole-model updates applied on the servers
                        // (slice updates / slices).
  double loss = 0;      // Mean test loss.
  double accuracy = 0;  // Fraction of the test set classified right.
};

// Pulls the current weights and scores `test` once. `client` has the model.
absl::StatusOr<Evaluation> EvaluateOnce(PsClient* client, Mlp* model,
                                        const Dataset& test, absl::Time start);

// Appends one row "seconds,updates,test_loss,test_accuracy" to `path`,
// writing the header first if the file is new or empty.
absl::Status AppendCurveRow(const std::string& path, const Evaluation& e);

// Evaluates every `every` until `stop` is notified, then once more (the
// final figure). Prints each evaluation; appends to `curve` if not empty.
absl::Status RunEvaluator(PsClient* client, Mlp* model, const Dataset& test,
                          absl::Duration every, const std::string& curve,
                          absl::Notification* stop);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_EVALUATOR_H_
