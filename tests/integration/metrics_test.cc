// Prometheus' /metrics of a real shard over HTTP: its counters move as a
// client pushes and pulls, the staleness histogram fills, and a busy port
// is a clear start-up error.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"

namespace asyncps::testing {
namespace {

// The body of GET /metrics on 127.0.0.1:port ("" on failure).
std::string Scrape(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    close(fd);
    return "";
  }
  const std::string get = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(write(fd, get.data(), get.size()),
            static_cast<ssize_t>(get.size()));
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) out.append(buf, n);
  close(fd);
  const size_t body = out.find("\r\n\r\n");
  return body == std::string::npos ? "" : out.substr(body + 4);
}

// The value of the sample line that starts with `series` + " ".
double Value(const std::string& text, const std::string& series) {
  const size_t at = text.find("\n" + series + " ");
  if (at == std::string::npos) {
    ADD_FAILURE() << "no '" << series << "' in:\n" << text;
    return -1;
  }
  return std::stod(text.substr(at + series.size() + 2));
}

TEST(Metrics, ShardCountersMoveAndABusyPortIsRefused) {
  const int port = FreePort();
  auto shards = StartLocalShards(
      1, [port](ShardServerConfig* c) { c->metrics_port = port; });
  ASSERT_TRUE(shards.ok()) << shards.status();
  const std::string before = Scrape(port);
  EXPECT_EQ(Value(before, "asyncps_shard_pushes_total"), 0);
  EXPECT_NE(before.find("# TYPE asyncps_shard_update_staleness histogram"),
            std::string::npos);

  PsClientOptions options;
  options.servers = shards->addresses;
  auto client = PsClient::Create(options);
  ASSERT_TRUE(client.ok());
  const v1::ModelSpec spec = ConstantSpec({{100}}, 1, 0.0f, 1.0f, 1 << 20);
  ASSERT_TRUE((*client)->Join(0, 1).ok());
  ASSERT_TRUE((*client)->DeclareModel(spec).ok());
  std::vector<std::vector<float>> w = {std::vector<float>(100)};
  std::vector<std::vector<float>> g = {std::vector<float>(100, 1.0f)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE((*client)->Pull({0}, &w, &versions, -1, 0).ok());
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE((*client)->Push({0}, g, versions, 0, 0, nullptr).ok());
  }
  const std::string after = Scrape(port);
  EXPECT_EQ(Value(after, "asyncps_shard_pushes_total"), 3);
  EXPECT_EQ(Value(after, "asyncps_shard_pulls_total"), 1);
  EXPECT_EQ(Value(after, "asyncps_shard_updates_applied_total"), 3);
  // Pushed from version 0 three times: staleness 0, 1 and 2.
  EXPECT_EQ(Value(after, "asyncps_shard_update_staleness_count"), 3);
  EXPECT_EQ(Value(after, "asyncps_shard_update_staleness_sum"), 3);
  EXPECT_EQ(Value(after, "asyncps_shard_slice_version_max"), 3);

  // A second shard on the same metrics port does not start.
  ShardServerConfig config;
  config.host = "127.0.0.1";
  config.metrics_port = port;
  auto second = ShardServer::Start(config);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(second.status().message().find("--metrics_port"), std::string::npos)
      << second.status();
}

// The value of the first sample of `name` whose labels hold `must_contain`.
double LabelledValue(const std::string& text, const std::string& name,
                     const std::string& must_contain) {
  for (size_t at = text.find("\n" + name + "{"); at != std::string::npos;
       at = text.find("\n" + name + "{", at + 1)) {
    const size_t end = text.find('\n', at + 1);
    const std::string line = text.substr(at + 1, end - at - 1);
    if (line.find(must_contain) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

// A worker's progress reaches the shard's /metrics through its heartbeats:
// samples, loss and the time of each phase of its steps.
TEST(Metrics, WorkersProgressShowsOnTheShard) {
  const int port = FreePort();
  auto cluster = TestCluster::Start(1, {absl::StrCat("--metrics_port=", port)});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker =
      StartWorker(**cluster, 0, 1, {"--steps=100000", "--slowdown=5"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  while (true) {
    auto line = (*worker)->WaitForLine("rank 0 step", absl::Seconds(60));
    ASSERT_TRUE(line.ok()) << line.status() << (*worker)->output();
    if (Field(*line, "step") >= 10) break;
  }
  // The heartbeat after step 10 (every 200 ms) carries it; poll the
  // scrapes for it, for at most 30 s.
  std::string text;
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (absl::Now() < give_up) {
    text = Scrape(port);
    if (LabelledValue(text, "asyncps_shard_worker_samples_total",
                      "rank=\"0\"") >= 10 * 32) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_GE(
      LabelledValue(text, "asyncps_shard_worker_samples_total", "rank=\"0\""),
      10 * 32)
      << text;
  for (const char* phase : {"data", "compute", "exchange"}) {
    EXPECT_GT(LabelledValue(text, "asyncps_shard_worker_step_seconds_total",
                            absl::StrCat("phase=\"", phase, "\"")),
              0)
        << phase;
  }
  EXPECT_GT(LabelledValue(text, "asyncps_shard_worker_loss", "rank=\"0\""), 0);
  // Each series has one owner: the shard says nothing under the worker's
  // own names, and ages are timestamps.
  EXPECT_EQ(text.find("\nasyncps_worker_"), std::string::npos) << text;
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  const double seen = LabelledValue(
      text, "asyncps_shard_worker_last_seen_timestamp_seconds", "rank=\"0\"");
  EXPECT_GT(seen, now - 60);
  EXPECT_LE(seen, now + 1);
  EXPECT_EQ(LabelledValue(text, "asyncps_shard_worker_finished", "rank=\"0\""),
            0);
  // Every process's own: build and process metrics.
  EXPECT_NE(text.find("\nasyncps_build_info{version=\"0.5.0\",commit=\""),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("commit=\"\"}"), std::string::npos) << text;
  for (const char* series :
       {"process_cpu_seconds_total", "process_resident_memory_bytes",
        "process_open_fds", "process_max_fds", "process_start_time_seconds"}) {
    EXPECT_NE(text.find(absl::StrCat("\n", series, " ")), std::string::npos)
        << series;
  }
}

// Polls `port`'s /metrics (at most 60 s) until `done` holds of the text;
// returns the last text.
template <typename Done>
std::string ScrapeUntil(int port, Done done) {
  std::string text;
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (absl::Now() < give_up) {
    text = Scrape(port);
    if (!text.empty() && done(text)) break;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return text;
}

// A worker and the evaluator serve /metrics of their own while they run
// (OpenBLAS is loaded in both: the scrape must not crash them), and the
// shard's per-call metrics count the data plane's push-pulls.
TEST(Metrics, WorkerAndEvaluatorServeTheirOwn) {
  const int shard_port = FreePort();
  auto cluster =
      TestCluster::Start(1, {absl::StrCat("--metrics_port=", shard_port)});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const int worker_port = FreePort();
  auto worker = StartWorker(**cluster, 0, 1,
                            {"--steps=100000", "--slowdown=3",
                             absl::StrCat("--metrics_port=", worker_port)});
  ASSERT_TRUE(worker.ok()) << worker.status();
  const int eval_port = FreePort();
  auto evaluator = StartWorker(
      **cluster, 0, 1,
      {"--role=evaluator", "--eval_every=200ms", "--max_test_examples=500",
       absl::StrCat("--metrics_port=", eval_port)});
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();

  const std::string w = ScrapeUntil(worker_port, [](const std::string& t) {
    return LabelledValue(t, "asyncps_worker_steps_total", "rank=\"0\"") >= 20 &&
           LabelledValue(t, "asyncps_worker_samples_per_second", "rank=\"0\"") >
               0;
  });
  EXPECT_GE(LabelledValue(w, "asyncps_worker_steps_total", "rank=\"0\""), 20)
      << w << (*worker)->output();
  EXPECT_GE(LabelledValue(w, "asyncps_worker_samples_total", "rank=\"0\""),
            20 * 32);
  EXPECT_GT(LabelledValue(w, "asyncps_worker_samples_per_second", "rank"), 0);
  EXPECT_GT(LabelledValue(w, "asyncps_worker_loss", "rank"), 0);
  EXPECT_GE(LabelledValue(w, "asyncps_worker_clock", "rank"), 20);
  for (const char* phase : {"data", "compute", "exchange"}) {
    EXPECT_GE(LabelledValue(w, "asyncps_worker_step_phase_seconds_count",
                            absl::StrCat("phase=\"", phase, "\"")),
              20)
        << phase;
  }
  EXPECT_GT(LabelledValue(w, "asyncps_worker_sent_bytes_total", "rank"), 0);
  EXPECT_GT(LabelledValue(w, "asyncps_worker_received_bytes_total", "rank"), 0);
  EXPECT_EQ(LabelledValue(w, "asyncps_worker_retries_total", "rank"), 0);

  const std::string e = ScrapeUntil(eval_port, [](const std::string& t) {
    return t.find("\nasyncps_evaluator_evaluations_total ") !=
               std::string::npos &&
           Value(t, "asyncps_evaluator_evaluations_total") >= 2;
  });
  EXPECT_GE(Value(e, "asyncps_evaluator_evaluations_total"), 2)
      << e << (*evaluator)->output();
  EXPECT_GT(Value(e, "asyncps_evaluator_accuracy"), 0.05);
  EXPECT_LE(Value(e, "asyncps_evaluator_accuracy"), 1.0);
  EXPECT_GT(Value(e, "asyncps_evaluator_loss"), 0);

  const std::string s = Scrape(shard_port);
  const double pushpulls =
      LabelledValue(s, "asyncps_shard_calls_total",
                    "code=\"OK\",method=\"PushPull\",transport=\"tcp\"");
  EXPECT_GE(pushpulls, 20) << s;
  EXPECT_GE(LabelledValue(s, "asyncps_shard_call_duration_seconds_count",
                          "method=\"PushPull\",transport=\"tcp\""),
            pushpulls);
  EXPECT_GT(LabelledValue(s, "asyncps_shard_received_bytes_total",
                          "method=\"PushPull\",transport=\"tcp\""),
            0);
  EXPECT_GT(LabelledValue(s, "asyncps_shard_calls_total",
                          "method=\"Register\",transport=\"grpc\""),
            0);

  (*worker)->Signal(SIGTERM);
  (*evaluator)->Signal(SIGTERM);
  EXPECT_EQ(ExitCode(**worker), 0) << (*worker)->output();
  EXPECT_EQ(ExitCode(**evaluator), 0) << (*evaluator)->output();
}

// A worker told to serve metrics on a port in use stops at start with
// exit status 2, naming the flag.
TEST(Metrics, WorkerRefusesABusyPort) {
  auto cluster = TestCluster::Start(1, {});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Held by a listener of our own for the whole test.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int busy = ntohs(a.sin_port);
  auto worker =
      StartWorker(**cluster, 0, 1, {absl::StrCat("--metrics_port=", busy)});
  ASSERT_TRUE(worker.ok()) << worker.status();
  auto failed = (*worker)->WaitForLine("ps_worker failed", absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  EXPECT_NE(failed->find("--metrics_port"), std::string::npos) << *failed;
  EXPECT_EQ(ExitCode(**worker), 2) << (*worker)->output();
  close(fd);
}

}  // namespace
}  // namespace asyncps::testing
