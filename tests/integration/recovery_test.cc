// Any process can die: real shards and workers SIGKILLed mid-training and
// restarted with the same flags, in async, ssp and bsp (and allreduce for
// workers). The job finishes, every worker exits 0, and a shard's death
// costs no more accuracy than the noise between two undisturbed runs.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "common/file_system.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

constexpr int kShards = 2;
constexpr int kWorkers = 2;

std::unique_ptr<PsClient> Client(const TestCluster& cluster) {
  PsClientOptions options;
  options.servers = cluster.servers();
  auto client = PsClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

std::vector<std::string> ServerFlags(const std::string& mode) {
  std::vector<std::string> flags = {"--mode=" + mode, "--worker_timeout=3s"};
  if (mode == "ssp") flags.push_back("--staleness=2");
  return flags;
}

// 4 epochs of 3000 examples per worker, 94 steps each, with a decaying
// learning rate so that the final accuracy varies little between runs;
// slowed down so that a death lands mid-training rather than after it.
constexpr int kSteps = 4 * 94;
std::vector<std::string> WorkerFlags(const std::string& mode) {
  return {"--mode=" + mode, "--max_train_examples=3000",
          "--epochs=4",     "--optimizer=sgd",
          "--lr=0.15",      "--lr_decay=0.01",
          "--slowdown=10"};
}

struct Job {
  std::unique_ptr<TestCluster> cluster;
  std::vector<std::unique_ptr<Subprocess>> workers;
};

// What happens to a run mid-training.
using Disturbance = std::function<void(Job&)>;

// Trains kWorkers workers on kShards shards, lets `disturb` act, waits for
// every worker to finish (exit 0), and returns the test accuracy of the
// final weights; `done`, if given, gets the workers' results.
double Train(const std::string& mode, const std::vector<std::string>& server,
             const Disturbance& disturb,
             std::vector<google::protobuf::Struct>* results = nullptr) {
  Job run;
  auto cluster = TestCluster::Start(kShards, server);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  if (!cluster.ok()) return -1;
  run.cluster = *std::move(cluster);
  for (int rank = 0; rank < kWorkers; ++rank) {
    auto w = StartWorker(*run.cluster, rank, kWorkers, WorkerFlags(mode));
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return -1;
    run.workers.push_back(*std::move(w));
  }
  if (disturb) disturb(run);
  for (int rank = 0; rank < kWorkers; ++rank) {
    Subprocess& w = *run.workers[rank];
    auto done = Finish(w, absl::Seconds(180));
    EXPECT_TRUE(done.ok()) << "rank " << rank << ": " << done.status();
    if (!done.ok()) continue;
    if (results != nullptr) results->push_back(*done);
    // bsp: a worker whose gradient missed a step jumps to the front.
    EXPECT_GE(Number(*done, "clock"), kSteps) << done->DebugString();
  }
  auto eval = EvaluateOnce(*run.cluster);
  EXPECT_TRUE(eval.ok()) << eval.status();
  return eval.ok() ? Number(*eval, "accuracy") : -1;
}

std::string CheckpointDir(const std::string& name) {
  return FreshTempDir(absl::StrCat("ckpt-", name));
}

// SIGKILLs shard 1 once rank 0 is at step 30, and restarts it with `flags`.
// With a checkpoint directory, one is taken at step 25 first, so the shard
// comes back with slices older than what the workers hold.
Disturbance KillShard(const std::vector<std::string>& flags, bool checkpoint) {
  return [flags, checkpoint](Job& run) {
    auto client = Client(*run.cluster);
    ASSERT_NE(client, nullptr);
    auto before = AdminClient(client->caller()).Stats(1);
    ASSERT_TRUE(before.ok()) << before.status();
    if (checkpoint) {
      WaitForStep(*run.workers[0], 0, 25);
      auto path = AdminClient(client->caller()).Checkpoint(1);
      ASSERT_TRUE(path.ok()) << path.status();
    }
    WaitForStep(*run.workers[0], 0, 30);
    ASSERT_TRUE(run.cluster->Restart(1, flags).ok());
    auto after = AdminClient(client->caller()).Stats(1);
    ASSERT_TRUE(after.ok()) << after.status();
    EXPECT_NE(after->incarnation(), before->incarnation());
  };
}

class ShardRestart : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardRestart, WorkersCarryOnWithAndWithoutACheckpoint) {
  const std::string mode = GetParam();
  const double undisturbed = Train(mode, ServerFlags(mode), nullptr);
  ASSERT_GT(undisturbed, 0.6);

  std::vector<std::string> with_ckpt = ServerFlags(mode);
  with_ckpt.push_back("--checkpoint_dir=" + CheckpointDir(mode));
  with_ckpt.push_back("--checkpoint_every=0");
  const double restored =
      Train(mode, with_ckpt, KillShard(with_ckpt, /*checkpoint=*/true));
  EXPECT_NEAR(restored, undisturbed, 0.03) << "restarted from a checkpoint";

  // No checkpoint: the workers declare the model again and one of them
  // hands the shard its copy of the weights.
  const double recovered =
      Train(mode, ServerFlags(mode), KillShard(ServerFlags(mode), false));
  EXPECT_NEAR(recovered, undisturbed, 0.03) << "restarted without one";
  std::printf(
      "%s accuracy: undisturbed %.4f, from a checkpoint %.4f, "
      "without one %.4f\n",
      mode.c_str(), undisturbed, restored, recovered);
}

INSTANTIATE_TEST_SUITE_P(Modes, ShardRestart,
                         ::testing::Values("async", "ssp", "bsp"));

class WorkerRestart : public ::testing::TestWithParam<std::string> {};

// SIGKILLs rank 1 at step 30 and starts a replacement with the same flags:
// it picks rank 1's share up where the job has it, and both finish.
TEST_P(WorkerRestart, ReplacementFinishesTheJob) {
  const std::string mode = GetParam();
  std::vector<google::protobuf::Struct> done;
  const double accuracy = Train(
      mode, ServerFlags(mode),
      [mode](Job& run) {
        WaitForStep(*run.workers[1], 1, 30);
        run.workers[1]->Signal(SIGKILL);
        ASSERT_EQ(ExitCode(*run.workers[1]), 128 + SIGKILL);
        auto replacement =
            StartWorker(*run.cluster, 1, kWorkers, WorkerFlags(mode));
        ASSERT_TRUE(replacement.ok()) << replacement.status();
        run.workers[1] = *std::move(replacement);
      },
      &done);
  EXPECT_GT(accuracy, 0.6);
  if (mode == "allreduce" && done.size() == 2) {
    // The re-formed ring started both from the same weights and state.
    EXPECT_EQ(Text(done[0], "weights"), Text(done[1], "weights"));
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerRestart,
                         ::testing::Values("async", "ssp", "bsp", "allreduce"));

// psctl checkpoint's job checkpoint in bsp mid-training: every slice of
// both shards at one step, and the whole job restored to it.
TEST(JobCheckpoint, EveryShardAtTheSameStepAndRestoredTogether) {
  const std::string dir = CheckpointDir("job");
  std::vector<std::string> flags = ServerFlags("bsp");
  flags.push_back("--checkpoint_dir=" + dir);
  flags.push_back("--checkpoint_every=0");
  std::vector<v1::ShardCheckpoint> files;
  Train("bsp", flags, [&](Job& run) {
    WaitForStep(*run.workers[0], 0, 30);
    auto client = Client(*run.cluster);
    ASSERT_NE(client, nullptr);
    auto paths = AdminClient(client->caller()).JobCheckpoint("mid");
    ASSERT_TRUE(paths.ok()) << paths.status();
    ASSERT_EQ(paths->size(), 2u);
    for (const std::string& path : *paths) {
      auto file = ReadCheckpointFile(FileSystem::Default(), path);
      ASSERT_TRUE(file.ok()) << file.status();
      files.push_back(*std::move(file));
    }
  });
  ASSERT_EQ(files.size(), 2u);
  const int64_t step = files[0].slices(0).applied_step();
  EXPECT_GT(step, 0);
  for (const auto& f : files) {
    for (const auto& s : f.slices()) {
      EXPECT_EQ(s.applied_step(), step) << "shard " << f.shard();
      EXPECT_EQ(s.version(), step) << "shard " << f.shard();
    }
  }
  // The whole job back at that step.
  std::vector<std::string> restore = flags;
  restore.push_back("--restore_job=mid");
  auto cluster = TestCluster::Start(kShards, restore);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client(**cluster);
  ASSERT_TRUE(client->FetchModel().ok());
  std::vector<int> all(client->spec().tensors_size());
  std::vector<std::vector<float>> w;
  for (int t = 0; t < client->spec().tensors_size(); ++t) {
    all[t] = t;
    int64_t n = 1;
    for (int64_t d : client->spec().tensors(t).shape()) n *= d;
    w.emplace_back(n);
  }
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(client->Pull(all, &w, &versions, -1, 0).ok());
  for (const SliceVersion& v : versions) EXPECT_EQ(v.version, step);
}

class WorkerStall : public ::testing::TestWithParam<std::string> {};

// SIGSTOPs rank 1 at step 30: once --worker_timeout has passed the others
// go on without it (rank 0 gets 40 steps further), and when it wakes it
// rejoins and both finish.
TEST_P(WorkerStall, StalledWorkerIsDroppedAndRejoinsWhenItWakes) {
  const std::string mode = GetParam();
  const double accuracy = Train(mode, ServerFlags(mode), [](Job& run) {
    WaitForStep(*run.workers[1], 1, 30);
    run.workers[1]->Signal(SIGSTOP);
    auto at = run.workers[0]->WaitForLine("rank 0 step", absl::Seconds(60));
    ASSERT_TRUE(at.ok()) << at.status();
    WaitForStep(*run.workers[0], 0, static_cast<int>(Field(*at, "step")) + 40);
    run.workers[1]->Signal(SIGCONT);
  });
  EXPECT_GT(accuracy, 0.6);
}

INSTANTIATE_TEST_SUITE_P(Modes, WorkerStall,
                         ::testing::Values("async", "ssp", "bsp"));

}  // namespace
}  // namespace asyncps::testing
