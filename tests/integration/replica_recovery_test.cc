// Replicated shards under real training: two shards, each a group of two
// ps_server processes (--replicas=2) coordinated by a real etcd, two
// ps_worker processes, in async, ssp and bsp. Mid-training a backup is
// SIGKILLed and restarted (it copies its primary's state while training
// goes on), then each shard's primary is SIGKILLed, the restarted backup's
// last, and started again (--min_insync=2: a group of one takes no push).
// No worker fails, each failover is timed (kill to promotion, printed),
// and the final accuracy is that of an undisturbed replicated run within the
// noise between two runs.
#include <signal.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"

namespace asyncps::testing {
namespace {

constexpr int kShards = 2;
constexpr int kWorkers = 2;
constexpr int kSteps = 4 * 94;  // As recovery_test: 4 epochs of 3000.

std::vector<std::string> ServerFlags(const std::string& mode) {
  std::vector<std::string> flags = {"--mode=" + mode, "--worker_timeout=3s"};
  if (mode == "ssp") flags.push_back("--staleness=2");
  return flags;
}

std::vector<std::string> WorkerFlags(const std::string& mode) {
  return {"--mode=" + mode, "--max_train_examples=3000",
          "--epochs=4",     "--optimizer=sgd",
          "--lr=0.15",      "--lr_decay=0.01",
          "--slowdown=10"};
}

// The role member `address` reports ("" if it does not answer).
std::string Role(const ServerAddress& address) {
  PsClientOptions options;
  options.servers = {address};
  options.rpc_timeout = absl::Seconds(1);
  options.retry_for = absl::ZeroDuration();
  auto client = PsClient::Create(options);
  if (!client.ok()) return "";
  auto stats = AdminClient((*client)->caller()).Stats(0);
  return stats.ok() ? stats->replica().role() : "";
}

// Which member of `shard` is its primary, waiting up to 30 s (-1: none).
int Primary(const TestCluster& cluster, int shard) {
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (absl::Now() < until) {
    for (int m = 0; m < 2; ++m) {
      if (Role(cluster.MemberAddress(shard, m)) == "primary") return m;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return -1;
}

// Waits until member `m` of `shard` reports `role`; returns how long it took.
absl::Duration WaitForRole(const TestCluster& cluster, int shard, int m,
                           const std::string& role) {
  const absl::Time start = absl::Now();
  while (Role(cluster.MemberAddress(shard, m)) != role) {
    if (absl::Now() - start > absl::Seconds(60)) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::Now() - start;
}

// Trains; with `disturb`, kills members mid-training. Returns the final
// accuracy (-1 on failure) and the failover times in `failovers`.
double Train(const std::string& mode, const std::string& etcd, bool disturb,
             std::vector<absl::Duration>* failovers) {
  auto started =
      TestCluster::StartReplicated(kShards, 2, etcd, ServerFlags(mode));
  EXPECT_TRUE(started.ok()) << started.status();
  if (!started.ok()) return -1;
  TestCluster& cluster = **started;
  int primary[kShards];
  for (int s = 0; s < kShards; ++s) {
    primary[s] = Primary(cluster, s);
    EXPECT_GE(primary[s], 0) << "shard " << s << " has no primary";
    if (primary[s] < 0) return -1;
    WaitForRole(cluster, s, 1 - primary[s], "backup");
  }
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int rank = 0; rank < kWorkers; ++rank) {
    auto w = StartWorker(cluster, rank, kWorkers, WorkerFlags(mode));
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return -1;
    workers.push_back(*std::move(w));
  }
  if (disturb) {
    // Shard 0's backup dies and comes back: it copies the state mid-run.
    WaitForStep(*workers[0], 0, 20);
    const int backup0 = 1 - primary[0];
    EXPECT_TRUE(cluster.RestartMember(0, backup0).ok());
    WaitForRole(cluster, 0, backup0, "backup");
    // Shard 1's primary dies.
    WaitForStep(*workers[0], 0, 40);
    cluster.member(1, primary[1]).Signal(SIGKILL);
    failovers->push_back(WaitForRole(cluster, 1, 1 - primary[1], "primary"));
    // Started again, as a supervisor (Kubernetes, compose) would: with the
    // default --min_insync=2 the promoted member takes no push alone.
    EXPECT_TRUE(cluster.RestartMember(1, primary[1]).ok());
    // Shard 0's primary dies: the restarted backup takes over.
    WaitForStep(*workers[0], 0, 60);
    cluster.member(0, primary[0]).Signal(SIGKILL);
    failovers->push_back(WaitForRole(cluster, 0, backup0, "primary"));
    EXPECT_TRUE(cluster.RestartMember(0, primary[0]).ok());
  }
  for (int rank = 0; rank < kWorkers; ++rank) {
    auto done = Finish(*workers[rank], absl::Seconds(180));
    EXPECT_TRUE(done.ok()) << "rank " << rank << ": " << done.status();
    if (!done.ok()) continue;
    EXPECT_GE(Number(*done, "clock"), kSteps) << done->DebugString();
  }
  auto eval = EvaluateOnce(cluster);
  EXPECT_TRUE(eval.ok()) << eval.status();
  return eval.ok() ? Number(*eval, "accuracy") : -1;
}

class ReplicaRecovery : public ::testing::TestWithParam<std::string> {};

TEST_P(ReplicaRecovery, KilledMembersCostNoAccuracy) {
  const std::string mode = GetParam();
  auto etcd = StartEtcd("etcd-" + mode);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::vector<absl::Duration> none;
  const double undisturbed = Train(mode, etcd->endpoint, false, &none);
  ASSERT_GT(undisturbed, 0.6);
  std::vector<absl::Duration> failovers;
  const double disturbed = Train(mode, etcd->endpoint, true, &failovers);
  // recovery_test's bound: the spread between two undisturbed runs.
  EXPECT_NEAR(disturbed, undisturbed, 0.03);
  ASSERT_EQ(failovers.size(), 2u);
  for (absl::Duration d : failovers) EXPECT_LT(d, absl::Seconds(10));
  std::printf(
      "%s accuracy: undisturbed %.4f, with 3 members killed %.4f; "
      "failovers (kill to promotion) %.0f ms, %.0f ms\n",
      mode.c_str(), undisturbed, disturbed,
      absl::ToDoubleMilliseconds(failovers[0]),
      absl::ToDoubleMilliseconds(failovers[1]));
}

// ps_server --exit_when_done with groups: once the job's worker finished,
// every member (primary and backup) serves for --done_linger, then exits 0.
TEST(ReplicaJob, EveryMemberEndsWithTheJob) {
  auto etcd = StartEtcd("etcd-done");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto cluster = TestCluster::StartReplicated(
      1, 2, etcd->endpoint, {"--exit_when_done", "--done_linger=1s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker =
      StartWorker(**cluster, 0, 1, {"--max_train_examples=600", "--epochs=1"});
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(Finish(**worker).ok());
  for (int m = 0; m < 2; ++m) {
    const int status = (*cluster)->member(0, m).Wait(absl::Seconds(60));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "member " << m << ": wait status " << status;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, ReplicaRecovery,
                         ::testing::Values("async", "ssp", "bsp"));

}  // namespace
}  // namespace asyncps::testing
