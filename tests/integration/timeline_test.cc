// --timeline on real processes: each file of a short run parses as JSON,
// psctl timeline merges them into one trace with a process per file and
// draws it; a killed process's cut file is read to its last whole event;
// a path that cannot be written is a start-up error.
#include <csignal>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "server/shard_server.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/temp_dir.h"
#include "tools/ops/timeline_merge.h"

namespace asyncps::testing {
namespace {

void Write(const std::string& path, const std::string& text) {
  ASSERT_TRUE(WriteFile(path, text)) << path;
}

TEST(Timeline, ARunsFilesParseAndMergeIntoOneTrace) {
  const std::string shard_file = TempPath("shard0.json");
  auto cluster = TestCluster::Start(
      1, {"--mode=ssp", "--staleness=1", "--timeline=" + shard_file});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::string> files = {shard_file};
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    files.push_back(TempPath(absl::StrCat("worker", rank, ".json")));
    auto w =
        StartWorker(**cluster, rank, 2,
                    {"--mode=ssp", "--steps=30", "--timeline=" + files.back()});
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*std::move(w));
  }
  for (auto& w : workers) EXPECT_EQ(ExitCode(*w), 0) << w->output();
  (*cluster)->process(0).Signal(SIGTERM);
  EXPECT_EQ((*cluster)->process(0).Wait(absl::Seconds(60)), 0);

  // Each file is one JSON array of events, as Chrome's loader wants it.
  for (const std::string& f : files) {
    google::protobuf::ListValue events;
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        ReadFile(f).value_or(""), &events);
    ASSERT_TRUE(parsed.ok()) << f << ": " << parsed.ToString();
    EXPECT_GT(events.values_size(), 30) << f;
  }

  const std::string merged = TempPath("merged.json");
  const std::string png = TempPath("timeline.png");
  std::vector<std::string> argv = {RunfilePath("tools/psctl"), "timeline",
                                   "--out=" + merged, "--plot=" + png};
  argv.insert(argv.end(), files.begin(), files.end());
  auto psctl = Subprocess::Start(argv);
  ASSERT_TRUE(psctl.ok()) << psctl.status();
  auto said = (*psctl)->WaitForLine("processes", absl::Seconds(60));
  ASSERT_TRUE(said.ok()) << said.status();
  EXPECT_NE(said->find("3 processes"), std::string::npos) << *said;
  EXPECT_EQ(ExitCode(**psctl), 0) << (*psctl)->output();

  google::protobuf::Struct trace;
  const auto parsed = google::protobuf::util::JsonStringToMessage(
      ReadFile(merged).value_or(""), &trace);
  ASSERT_TRUE(parsed.ok()) << parsed.ToString();
  std::set<std::string> names;
  std::set<std::pair<double, std::string>> kinds;  // (pid, category)
  for (const auto& v : trace.fields().at("traceEvents").list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() == "M" &&
        f.at("name").string_value() == "process_name") {
      names.insert(
          f.at("args").struct_value().fields().at("name").string_value());
    }
    if (f.at("ph").string_value() == "X") {
      EXPECT_GE(f.at("ts").number_value(), 0);
      kinds.insert({f.at("pid").number_value(), f.at("cat").string_value()});
    }
  }
  EXPECT_EQ(names, (std::set<std::string>{"shard 0", "worker 0", "worker 1"}));
  // pid 1 is the shard (first file), 2 and 3 the workers.
  EXPECT_TRUE(kinds.count({1, "serve tcp"})) << "shard served no push-pull";
  for (double pid : {2, 3}) {
    for (const char* cat : {"data", "compute", "exchange", "wait"}) {
      EXPECT_TRUE(kinds.count({pid, cat})) << "pid " << pid << " " << cat;
    }
  }
  EXPECT_EQ(ReadFile(png).value_or("").substr(0, 4), "\x89PNG");
}

TEST(Timeline, AKilledProcessesFileIsReadToItsLastWholeEvent) {
  const std::string meta =
      "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":7,\"tid\":0,"
      "\"args\":{\"name\":\"worker 5\"}}";
  const std::string span =
      ",\n{\"name\":\"pull\",\"cat\":\"exchange\",\"ph\":\"X\",\"ts\":100,"
      "\"dur\":5,\"pid\":7,\"tid\":9,\"args\":{}}";
  const std::string cut = TempPath("cut.json");
  Write(cut, meta + span + span + ",\n{\"name\":\"pu");
  auto merged = MergeTimelines({cut});
  ASSERT_TRUE(merged.ok()) << merged.status();
  EXPECT_EQ(merged->processes, std::vector<std::string>{"worker 5"});
  EXPECT_EQ(merged->spans.size(), 2u);
  EXPECT_EQ(merged->dropped_lines, 1);
  EXPECT_EQ(merged->spans[0].start_us, 0);  // Relative to the first span.

  // Damage before the last line is an error naming the file and line.
  const std::string bad = TempPath("bad.json");
  Write(bad, meta + ",\n{oops}" + span + "\n]\n");
  auto refused = MergeTimelines({bad});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("bad.json:2"), std::string::npos)
      << refused.status();
  const std::string other = TempPath("other.json");
  Write(other, "{\"not\": \"a timeline\"}\n");
  EXPECT_FALSE(MergeTimelines({other}).ok());
  EXPECT_FALSE(MergeTimelines({TempPath("missing.json")}).ok());
}

TEST(Timeline, AnUnwritablePathIsAStartUpError) {
  ShardServerConfig config;
  config.host = "";
  config.timeline = "/nonexistent-dir/shard.json";
  auto server = ShardServer::Start(config);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(server.status().message().find("--timeline"), std::string::npos)
      << server.status();

  auto cluster = TestCluster::Start(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker =
      StartWorker(**cluster, 0, 1, {"--timeline=/nonexistent-dir/w.json"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto failed = (*worker)->WaitForLine("ps_worker failed", absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_NE(failed->find("--timeline"), std::string::npos) << *failed;
  EXPECT_EQ(ExitCode(**worker), 2);
}

}  // namespace
}  // namespace asyncps::testing
