#include "tests/integration/worker_runner.h"

#include <sys/wait.h>

#include <optional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "tests/testing/temp_dir.h"

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
  const std::string result = UniqueTempPath("result", ".json");
  argv.push_back(absl::StrCat("--result_json=", result));
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Subprocess::Start(argv, result);
}

absl::StatusOr<google::protobuf::Struct> Finish(Subprocess& worker,
                                                absl::Duration timeout) {
  const int code = ExitCode(worker, timeout);
  if (code != 0) {
    return absl::InternalError(
        absl::StrCat("worker pid ", worker.pid(), " ended with ", code,
                     "; its output:\n", worker.output()));
  }
  std::optional<std::string> text = ReadFile(worker.result_file());
  if (!text.has_value()) {
    return absl::NotFoundError(absl::StrCat(
        "worker pid ", worker.pid(), " wrote no ", worker.result_file()));
  }
  return ParseJson(*text);
}

absl::StatusOr<std::unique_ptr<Subprocess>> StartEvaluator(
    const TestCluster& cluster, const std::vector<std::string>& extra) {
  const std::string result = UniqueTempPath("eval", ".json");
  std::vector<std::string> argv = {
      RunfilePath("worker/ps_worker"),
      absl::StrCat("--servers=", cluster.ServerList()), "--role=evaluator",
      absl::StrCat("--result_json=", result)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  return Subprocess::Start(argv, result);
}

absl::StatusOr<google::protobuf::Struct> EvaluateOnce(
    const TestCluster& cluster, const std::vector<std::string>& extra) {
  std::vector<std::string> flags = {"--eval_once"};
  flags.insert(flags.end(), extra.begin(), extra.end());
  auto eval = StartEvaluator(cluster, flags);
  if (!eval.ok()) return eval.status();
  return Finish(**eval, absl::Seconds(60));
}

double Number(const google::protobuf::Struct& result, const std::string& key) {
  const auto at = result.fields().find(key);
  if (at == result.fields().end() || !at->second.has_number_value()) {
    ADD_FAILURE() << "no number '" << key << "' in the result";
    return -1;
  }
  return at->second.number_value();
}

std::string Text(const google::protobuf::Struct& result,
                 const std::string& key) {
  const auto at = result.fields().find(key);
  if (at == result.fields().end() || !at->second.has_string_value()) {
    ADD_FAILURE() << "no text '" << key << "' in the result";
    return "";
  }
  return at->second.string_value();
}

double Field(const std::string& line, const std::string& key) {
  std::vector<std::string> parts = absl::StrSplit(line, absl::ByAnyChar(" ="));
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    double v = -1;
    if (parts[i] == key && absl::SimpleAtod(parts[i + 1], &v)) return v;
  }
  ADD_FAILURE() << "no number after '" << key << "' in: " << line;
  return -1;
}

void WaitForStep(Subprocess& worker, int rank, int step) {
  while (true) {
    auto line = worker.WaitForLine(absl::StrCat("rank ", rank, " step"),
                                   absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << line.status() << "\n" << worker.output();
    if (Field(*line, "step") >= step) return;
  }
}

int ExitCode(Subprocess& p, absl::Duration timeout) {
  const int status = p.Wait(timeout);
  if (status == -1) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace asyncps::testing
