// Test helper: starting ps_worker processes and reading their results.
#ifndef ASYNCPS_TESTS_INTEGRATION_WORKER_RUNNER_H_
#define ASYNCPS_TESTS_INTEGRATION_WORKER_RUNNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {

// Starts `ps_worker --servers=<cluster> --rank=R --num_workers=N` plus a
// fixed seed, a small batch, quick progress lines, a --result_json of its
// own and `extra`.
absl::StatusOr<std::unique_ptr<Subprocess>> StartWorker(
    const TestCluster& cluster, int rank, int num_workers,
    const std::vector<std::string>& extra);

// Waits for a worker StartWorker started to exit, and returns its
// --result_json (steps, samples, first_loss, last_loss, clock, weights,
// ...); an error if it failed or wrote none.
absl::StatusOr<google::protobuf::Struct> Finish(
    Subprocess& worker, absl::Duration timeout = absl::Seconds(120));

// Starts `ps_worker --role=evaluator` with a --result_json of its own plus
// `extra` against `cluster` (Finish returns its result).
absl::StatusOr<std::unique_ptr<Subprocess>> StartEvaluator(
    const TestCluster& cluster, const std::vector<std::string>& extra);

// Runs `ps_worker --role=evaluator --eval_once` plus `extra` against
// `cluster` and returns its --result_json (updates, test_loss, accuracy).
absl::StatusOr<google::protobuf::Struct> EvaluateOnce(
    const TestCluster& cluster, const std::vector<std::string>& extra = {});

// A result's number or text (a test failure if absent).
double Number(const google::protobuf::Struct& result, const std::string& key);
std::string Text(const google::protobuf::Struct& result,
                 const std::string& key);

// The value after `key` in a progress line, "... key value ..." or
// "key=value" (a test failure if absent).
double Field(const std::string& line, const std::string& key);

// Reads `worker`'s progress lines until one says rank `rank` is at step >=
// `step` (a test failure if none comes within a minute of the last).
void WaitForStep(Subprocess& worker, int rank, int step);

// Waits for exit; the exit code, 128 + signal, or -1 on timeout.
int ExitCode(Subprocess& p, absl::Duration timeout = absl::Seconds(120));

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_WORKER_RUNNER_H_
