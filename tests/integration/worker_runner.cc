#include "tests/integration/worker_runner.h"

#include <sys/wait.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace asyncps::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> StartWorker(
    const TestCluster& cluster, int rank, int num_workers,
    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {
      RunfilePath("worker/ps_worker"),
      absl::StrCat("--servers=", cluster.ServerList()),
      absl::StrCat("--rank=", rank),
      absl::StrCat("--num_workers=", num_workers),
      "--seed=3",
      "--batch_size=32",
      "--log_every=100ms",
      "--heartbeat_every=200ms",
      "--rpc_timeout=20s"};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Subprocess::Start(argv);
}

std::string TextField(const std::string& line, const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(line, absl::ByAnyChar(" ="));
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i] == key) return parts[i + 1];
  }
  ADD_FAILURE() << "no '" << key << "' in: " << line;
  return "";
}

double Field(const std::string& line, const std::string& key) {
  double v = -1;
  if (!absl::SimpleAtod(TextField(line, key), &v)) {
    ADD_FAILURE() << "'" << key << "' is not a number in: " << line;
  }
  return v;
}

int ExitCode(Subprocess& p, absl::Duration timeout) {
  const int status = p.Wait(timeout);
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace asyncps::testing
