// Test helper: starting ps_worker processes and reading their result lines.
#ifndef ASYNCPS_TESTS_INTEGRATION_WORKER_RUNNER_H_
#define ASYNCPS_TESTS_INTEGRATION_WORKER_RUNNER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {

// Starts `ps_worker --servers=<cluster> --rank=R --num_workers=N` plus a
// fixed seed, a small batch, quick progress lines and `extra`.
absl::StatusOr<std::unique_ptr<Subprocess>> StartWorker(
    const TestCluster& cluster, int rank, int num_workers,
    const std::vector<std::string>& extra);

// The value after `key` in a "... key value ..." or "key=value" line
// (a test failure if absent).
double Field(const std::string& line, const std::string& key);
std::string TextField(const std::string& line, const std::string& key);

// Waits for exit; the exit code, 128 + signal, or -1 on timeout.
int ExitCode(Subprocess& p, absl::Duration timeout = absl::Seconds(120));

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_WORKER_RUNNER_H_
