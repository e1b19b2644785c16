// Real processes: two ps_server shards and two ps_worker processes training
// the MLP on a slice of Fashion-MNIST, and an evaluator scoring the result.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"

namespace asyncps::testing {
namespace {

// Starts ranks 0 and 1 of 2 on 3 epochs of 3,000 examples, with `extra`.
void StartTwo(TestCluster& cluster, std::vector<std::string> extra,
              std::vector<std::unique_ptr<Subprocess>>* workers) {
  extra.insert(extra.begin(), {"--max_train_examples=3000", "--epochs=3"});
  for (int rank = 0; rank < 2; ++rank) {
    auto w = StartWorker(cluster, rank, 2, extra);
    ASSERT_TRUE(w.ok()) << w.status();
    workers->push_back(*std::move(w));
  }
}

TEST(Training, TwoWorkersLearnFashionMnist) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Subprocess>> workers;
  ASSERT_NO_FATAL_FAILURE(StartTwo(**cluster, {}, &workers));
  for (int rank = 0; rank < 2; ++rank) {
    auto done = Finish(*workers[rank]);
    ASSERT_TRUE(done.ok()) << done.status();
    // Against the loss of an untrained 10-class model (ln 10), not the
    // worker's own first loss: a worker that joins late starts on weights
    // the other one has already trained.
    EXPECT_LT(Number(*done, "last_loss"), 0.6 * std::log(10.0))
        << done->DebugString();
  }
  auto eval = EvaluateOnce(**cluster, {"--max_test_examples=2000"});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(Number(*eval, "accuracy"), 0.70) << eval->DebugString();
  // 2 workers x 3 epochs x ceil(3000 / 32) steps, every step one update of
  // the whole model.
  EXPECT_EQ(Number(*eval, "updates"), 2 * 3 * 94) << eval->DebugString();
}

// --compress=topk:0.01: each slice's gradient as its 1 % largest elements,
// the rest kept on the worker (error feedback); the job still learns well
// above chance (0.1), the servers applying every update.
TEST(Training, TopKGradientsWithErrorFeedbackStillLearn) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Subprocess>> workers;
  ASSERT_NO_FATAL_FAILURE(
      StartTwo(**cluster, {"--compress=topk:0.01"}, &workers));
  for (auto& w : workers) {
    auto done = Finish(*w);
    ASSERT_TRUE(done.ok()) << done.status();
    // Each step's push of the MLP's 235,146 parameters would be 940,584
    // bytes in f32; top-k's 1 % (8 bytes an element) and the pulls'
    // requests stay under a tenth of that.
    const double f32 = Number(*done, "steps") * 235146 * 4;
    EXPECT_LT(Number(*done, "sent_bytes"), f32 / 10) << done->DebugString();
    EXPECT_GT(Number(*done, "sent_bytes"), 0) << done->DebugString();
    std::printf("topk:0.01 sent %.0f bytes\n", Number(*done, "sent_bytes"));
  }
  auto eval = EvaluateOnce(**cluster, {"--max_test_examples=2000"});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(Number(*eval, "accuracy"), 0.5) << eval->DebugString();
  EXPECT_EQ(Number(*eval, "updates"), 2 * 3 * 94) << eval->DebugString();
  std::printf("topk:0.01 accuracy %.4f\n", Number(*eval, "accuracy"));
}

// --stale_policy=dc (DC-ASGD, issue #42): two async workers on shards that
// compensate each stale gradient for its delay still learn as plain async
// does, and the shards say they compensated (the exact arithmetic is
// delay_compensation_test's and the Python client test's).
TEST(Training, DelayCompensatedAsyncLearns) {
  auto cluster = TestCluster::Start(2, {"--stale_policy=dc:0.04"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Subprocess>> workers;
  ASSERT_NO_FATAL_FAILURE(StartTwo(**cluster, {}, &workers));
  for (auto& w : workers) ASSERT_TRUE(Finish(*w).ok());
  auto eval = EvaluateOnce(**cluster, {"--max_test_examples=2000"});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(Number(*eval, "accuracy"), 0.70) << eval->DebugString();
  EXPECT_EQ(Number(*eval, "updates"), 2 * 3 * 94) << eval->DebugString();
  PsClientOptions options;
  options.servers = (*cluster)->servers();
  auto client = PsClient::Create(options);
  ASSERT_TRUE(client.ok());
  auto stats = AdminClient((*client)->caller()).StatsAll();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t compensated = 0, stale = 0;
  for (const v1::StatsResponse& s : *stats) {
    compensated += s.compensated() + s.uncompensated();
    for (size_t k = 1; k < s.staleness_histogram().size(); ++k) {
      stale += s.staleness_histogram(k);
    }
  }
  // Every stale gradient was compensated or counted as not (out of the
  // window); two workers side by side make some.
  EXPECT_EQ(compensated, stale);
  EXPECT_GT(stale, 0);
}

// --outer (issue #42, docs/MODES.md "Outer optimizers"): ps_worker's local
// steps with its own momentum SGD, one exchange every 4 steps, the servers
// applying the outer optimizer: each policy learns, the servers apply one
// update a round, and the workers send about a quarter of the bytes. The
// arithmetic is outer_test.py's (against a plain-PyTorch reference).
class OuterTraining
    : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(OuterTraining, Learns) {
  const auto [outer, mode] = GetParam();
  auto cluster = TestCluster::Start(2, {absl::StrCat("--mode=", mode)});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Subprocess>> workers;
  ASSERT_NO_FATAL_FAILURE(
      StartTwo(**cluster,
               {absl::StrCat("--mode=", mode), absl::StrCat("--outer=", outer),
                "--local_steps=4", "--max_train_examples=2000", "--epochs=2",
                "--optimizer=sgd", "--lr=0.05"},
               &workers));
  double steps = 0;
  for (auto& w : workers) {
    auto done = Finish(*w);
    ASSERT_TRUE(done.ok()) << done.status();
    steps = Number(*done, "steps");
    const double every_step = Number(*done, "steps") * 235146 * 4;
    EXPECT_LT(Number(*done, "sent_bytes"), every_step / 3.5)
        << done->DebugString();
  }
  auto eval = EvaluateOnce(**cluster, {"--max_test_examples=2000"});
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_GT(Number(*eval, "accuracy"), 0.65) << eval->DebugString();
  // One update a round: 2 workers' in async, both ranks' as one in bsp.
  const double rounds = std::floor(steps / 4);
  EXPECT_EQ(Number(*eval, "updates"),
            std::string(mode) == "bsp" ? rounds : 2 * rounds)
      << eval->DebugString();
  std::printf("--outer=%s --mode=%s accuracy %.4f\n", outer, mode,
              Number(*eval, "accuracy"));
}

INSTANTIATE_TEST_SUITE_P(Policies, OuterTraining,
                         ::testing::Values(std::pair{"diloco", "bsp"},
                                           std::pair{"diloco", "async"},
                                           std::pair{"easgd", "async"}),
                         [](const auto& info) {
                           return absl::StrCat(info.param.first, "_",
                                               info.param.second);
                         });

// --dynamic_local_steps (asynchronous DiLoCo's dynamic local updates): a
// worker 4x slower than the other takes shorter rounds, scaled by its rate
// over the fastest one's that the heartbeats answer, so it pushes more
// often per step than the fast worker (without it, as often: 1 push a
// round of 8). Each worker's bytes sent per step say how often it pushed.
TEST(Training, DynamicLocalStepsShortenTheSlowWorkersRounds) {
  auto cluster = TestCluster::Start(2, {"--mode=async"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Subprocess>> workers;
  // Both for about as long (~6 s): the fast one 8 epochs at slowdown 4, the
  // slow one 2 at 16 (the job's fastest rate is the fast one's while it
  // runs, first reported after a second of it).
  for (int rank = 0; rank < 2; ++rank) {
    auto w = StartWorker(
        **cluster, rank, 2,
        {"--mode=async", "--outer=diloco", "--local_steps=8",
         "--dynamic_local_steps", "--optimizer=sgd", "--lr=0.05",
         "--max_train_examples=8000", "--batch_size=64",
         "--heartbeat_every=100ms", rank == 0 ? "--epochs=8" : "--epochs=2",
         rank == 0 ? "--slowdown=4" : "--slowdown=16"});
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*std::move(w));
  }
  double bytes_per_step[2];
  for (int rank = 0; rank < 2; ++rank) {
    auto done = Finish(*workers[rank]);
    ASSERT_TRUE(done.ok()) << done.status();
    bytes_per_step[rank] = Number(*done, "sent_bytes") / Number(*done, "steps");
  }
  std::printf("bytes sent per step: fast %.0f, slow %.0f\n", bytes_per_step[0],
              bytes_per_step[1]);
  EXPECT_GT(bytes_per_step[1], 1.5 * bytes_per_step[0]);
}

// Replicas of one container (docker-compose --scale) start with --rank=-1:
// shard 0 assigns each the lowest rank not live, the other shard is told
// the same, and the job trains as with ranks given.
TEST(Training, WorkersAskingForARankGetDistinctOnes) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int i = 0; i < 2; ++i) {
    // More steps than the test waits for: neither is done (and leaves its
    // rank to the other) before both have one.
    auto w = StartWorker(**cluster, 0, 2,
                         {"--rank=-1", "--max_train_examples=3000",
                          "--epochs=1000000", "--log_every=1ms"});
    ASSERT_TRUE(w.ok()) << w.status();
    workers.push_back(*std::move(w));
  }
  std::set<std::string> ranks;
  for (auto& w : workers) {
    auto step = w->WaitForLine(" step ", absl::Seconds(120));
    ASSERT_TRUE(step.ok()) << step.status() << "\n" << w->output();
    ranks.insert(step->substr(0, step->find(" step ")));
  }
  EXPECT_EQ(ranks, (std::set<std::string>{"rank 0", "rank 1"}));
  for (auto& w : workers) {
    w->Signal(SIGTERM);  // Stops after the step in progress.
    auto done = Finish(*w, absl::Seconds(60));
    ASSERT_TRUE(done.ok()) << done.status();
  }
}

TEST(Training, SigkilledWorkerLeavesTheOthersTraining) {
  auto cluster = TestCluster::Start(2, {"--worker_timeout=2s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto victim =
      StartWorker(**cluster, 1, 2, {"--steps=100000000", "--epochs=1000000"});
  ASSERT_TRUE(victim.ok());
  ASSERT_TRUE((*victim)->WaitForLine("rank 1 step", absl::Seconds(60)).ok())
      << (*victim)->output();
  auto survivor = StartWorker(**cluster, 0, 2, {"--steps=400"});
  ASSERT_TRUE(survivor.ok());
  ASSERT_TRUE((*survivor)->WaitForLine("rank 0 step", absl::Seconds(60)).ok());

  (*victim)->Signal(SIGKILL);
  ASSERT_NE((*victim)->Wait(absl::Seconds(10)), -1);
  PsClientOptions options;
  options.servers = (*cluster)->servers();
  auto client = PsClient::Create(options);
  ASSERT_TRUE(client.ok());
  auto before = AdminClient((*client)->caller()).StatsAll();
  ASSERT_TRUE(before.ok()) << before.status();

  auto done = Finish(**survivor);
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(Number(*done, "steps"), 400);
  auto after = AdminClient((*client)->caller()).StatsAll();
  ASSERT_TRUE(after.ok()) << after.status();
  for (int s = 0; s < 2; ++s) {
    EXPECT_GT((*after)[s].pushes(), (*before)[s].pushes())
        << "shard " << s << " stopped applying pushes after the kill";
    bool saw_victim = false;
    for (const auto& w : (*after)[s].workers()) saw_victim |= w.rank() == 1;
    EXPECT_TRUE(saw_victim);
  }
}

}  // namespace
}  // namespace asyncps::testing
