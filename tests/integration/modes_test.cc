// The consistency modes with real processes: bsp against one worker on the
// combined batches, allreduce replicas against each other and against bsp,
// ssp's clock bound, bsp backup workers, and dead workers in bsp and
// allreduce.
#include <signal.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "common/optimizer.h"
#include "gtest/gtest.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/mlp.h"

namespace asyncps::testing {
namespace {

std::unique_ptr<PsClient> Client(const TestCluster& cluster) {
  PsClientOptions options;
  options.servers = cluster.servers();
  auto client = PsClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// Runs two workers to completion and returns their results.
std::vector<google::protobuf::Struct> RunTwoWorkers(
    const TestCluster& cluster, const std::vector<std::string>& extra) {
  std::vector<std::unique_ptr<Subprocess>> workers;
  for (int rank = 0; rank < 2; ++rank) {
    auto w = StartWorker(cluster, rank, 2, extra);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return {};
    workers.push_back(*std::move(w));
  }
  std::vector<google::protobuf::Struct> results;
  for (auto& w : workers) {
    auto done = Finish(*w);
    EXPECT_TRUE(done.ok()) << done.status();
    results.push_back(done.ok() ? *done : google::protobuf::Struct());
  }
  return results;
}

// One worker, in process, from weights `w0`: each step's two batches (x, y
// at 2t and 2t + 1, `batch` examples each) as one batch of 2 * batch,
// plain SGD at 0.5. Returns the weights after the last step.
std::vector<std::vector<float>> TrainOnCombinedBatches(
    const std::vector<int>& layers, int batch,
    const std::vector<std::vector<float>>& x,
    const std::vector<std::vector<int>>& y,
    const std::vector<std::vector<float>>& w0) {
  std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
  Mlp model(cpu.get(), layers, 2 * batch);
  std::vector<std::vector<float>> w = w0;
  const int steps = static_cast<int>(x.size()) / 2;
  for (int t = 0; t < steps; ++t) {
    std::vector<float> xx = x[2 * t];
    xx.insert(xx.end(), x[2 * t + 1].begin(), x[2 * t + 1].end());
    std::vector<int> yy = y[2 * t];
    yy.insert(yy.end(), y[2 * t + 1].begin(), y[2 * t + 1].end());
    model.SetWeights(w);
    model.TrainStep(xx.data(), yy.data(), 2 * batch, 1.0f, false, nullptr);
    for (size_t k = 0; k < w.size(); ++k) {
      SgdStep(0.5f, 0.0f, model.grads()[k], absl::MakeSpan(w[k]));
    }
  }
  return w;
}

TEST(Bsp, TwoWorkersEqualOneWorkerOnTheCombinedBatches) {
  auto cluster = TestCluster::Start(2, {"--mode=bsp"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::vector<int> layers = {20, 16, 5};
  const int batch = 8, steps = 4;
  v1::OptimizerSpec sgd;
  sgd.set_kind(v1::OptimizerSpec::SGD);
  sgd.set_learning_rate(0.5f);
  const v1::ModelSpec spec = MlpSpec(layers, sgd, 9, 256, 2);
  // Each worker's batch for each step; the single worker sees both.
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::vector<std::vector<float>> x(2 * steps);
  std::vector<std::vector<int>> y(2 * steps);
  for (int i = 0; i < 2 * steps; ++i) {
    for (int k = 0; k < batch * layers[0]; ++k) x[i].push_back(u(rng));
    for (int k = 0; k < batch; ++k) y[i].push_back((i + 3 * k) % 5);
  }
  // Rank 0 declares; rank 1 has joined before either steps (steps wait
  // until both have).
  std::vector<std::unique_ptr<PsClient>> clients;
  clients.push_back(Client(**cluster));
  clients.push_back(Client(**cluster));
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(clients[r]->Join(r, 2).ok());
  PsClient* setup = clients[0].get();
  ASSERT_TRUE(setup->DeclareModel(spec).ok());
  const std::vector<int> tensors = {0, 1, 2, 3};
  std::vector<std::vector<float>> w0(4);
  for (int t = 0; t < 4; ++t)
    w0[t].resize(setup->partition().tensor_elements(t));
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(setup->Pull(tensors, &w0, &versions, -1, 0).ok());

  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      PsClient* client = clients[r].get();
      absl::Status& s = results[r];
      s = client->UseModel(spec);
      std::unique_ptr<Backend> cpu = MakeCpuBackend(1);
      Mlp model(cpu.get(), layers, batch);
      std::vector<std::vector<float>> w = w0;
      std::vector<SliceVersion> v;
      if (s.ok()) s = client->Pull(tensors, &w, &v, r, 0);
      for (int t = 1; t <= steps && s.ok(); ++t) {
        model.SetWeights(w);
        const int i = 2 * (t - 1) + r;
        model.TrainStep(x[i].data(), y[i].data(), batch, 1.0f, false, nullptr);
        s = client->Push(tensors, model.grads(), v, r, t, nullptr);
        if (s.ok()) s = client->Pull(tensors, &w, &v, r, t);  // Held.
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 2; ++r) ASSERT_TRUE(results[r].ok()) << results[r];

  const std::vector<std::vector<float>> w =
      TrainOnCombinedBatches(layers, batch, x, y, w0);
  std::vector<std::vector<float>> served = w0;
  ASSERT_TRUE(setup->Pull(tensors, &served, &versions, -1, 0).ok());
  for (const SliceVersion& v : versions) EXPECT_EQ(v.version, steps);
  for (int k = 0; k < 4; ++k) {
    for (size_t e = 0; e < w[k].size(); ++e) {
      EXPECT_NEAR(served[k][e], w[k][e], 1e-5 + 1e-5 * std::abs(w[k][e]))
          << "tensor " << k << " element " << e;
    }
  }
}

TEST(Allreduce, ReplicasAreBitIdenticalAndEqualBsp) {
  const std::vector<std::string> flags = {"--steps=25",
                                          "--max_train_examples=2000"};
  std::string bsp_weights;
  {
    auto cluster = TestCluster::Start(2, {"--mode=bsp"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    std::vector<std::string> extra = flags;
    extra.push_back("--mode=bsp");
    auto results = RunTwoWorkers(**cluster, extra);
    ASSERT_EQ(results.size(), 2u);
    bsp_weights = Text(results[0], "weights");
    EXPECT_EQ(Text(results[1], "weights"), bsp_weights);
  }
  auto cluster = TestCluster::Start(2, {"--mode=allreduce"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::string> extra = flags;
  extra.push_back("--mode=allreduce");
  extra.push_back("--assign_every=10");
  auto results = RunTwoWorkers(**cluster, extra);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(Text(results[0], "weights"), Text(results[1], "weights"))
      << results[0].DebugString() << "\n"
      << results[1].DebugString();
  EXPECT_EQ(Text(results[0], "weights"), bsp_weights);
  // Rank 0 handed the final weights to the servers, at version 25.
  auto client = Client(**cluster);
  ASSERT_TRUE(client->FetchModel().ok());
  std::vector<std::vector<float>> w(client->spec().tensors_size());
  for (size_t t = 0; t < w.size(); ++t) {
    w[t].resize(client->partition().tensor_elements(t));
  }
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(client->Pull({0, 1, 2, 3, 4, 5}, &w, &versions, -1, 0).ok());
  for (const SliceVersion& v : versions) EXPECT_EQ(v.version, 25);
}

// --compress=f16 (Horovod's fp16 compression): the ring sums in half
// precision; both replicas still end bit-identical, the half sums change
// the weights (not the f32 run's), and the job learns.
TEST(Allreduce, F16RingKeepsReplicasIdenticalAndLearns) {
  const std::vector<std::string> flags = {
      "--steps=40", "--max_train_examples=2000", "--mode=allreduce",
      "--assign_every=10"};
  std::string f32_weights;
  {
    auto cluster = TestCluster::Start(1, {"--mode=allreduce"});
    ASSERT_TRUE(cluster.ok()) << cluster.status();
    auto results = RunTwoWorkers(**cluster, flags);
    ASSERT_EQ(results.size(), 2u);
    f32_weights = Text(results[0], "weights");
  }
  auto cluster = TestCluster::Start(1, {"--mode=allreduce"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::string> f16 = flags;
  f16.push_back("--compress=f16");
  auto results = RunTwoWorkers(**cluster, f16);
  ASSERT_EQ(results.size(), 2u);
  EXPECT_EQ(Text(results[0], "weights"), Text(results[1], "weights"));
  EXPECT_NE(Text(results[0], "weights"), f32_weights);
  for (const auto& r : results) {
    EXPECT_LT(Number(r, "last_loss"), 0.8 * Number(r, "first_loss"))
        << r.DebugString();
  }
}

TEST(Ssp, ClockGapNeverExceedsTheBound) {
  constexpr int kStaleness = 2;
  auto cluster = TestCluster::Start(
      2, {"--mode=ssp", absl::StrCat("--staleness=", kStaleness)});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto fast = StartWorker(**cluster, 0, 2, {"--mode=ssp", "--steps=60"});
  auto slow = StartWorker(**cluster, 1, 2,
                          {"--mode=ssp", "--steps=60", "--slowdown=6"});
  ASSERT_TRUE(fast.ok() && slow.ok());
  for (auto* w : {&*fast, &*slow}) {
    auto done = Finish(**w);
    ASSERT_TRUE(done.ok()) << done.status();
  }
  auto client = Client(**cluster);
  auto stats = AdminClient(client->caller()).StatsAll();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t held = 0;
  for (const auto& s : *stats) {
    EXPECT_LE(s.max_clock_gap(), kStaleness + 1) << "shard " << s.shard();
    held += s.held_pulls();
  }
  // The bound was exercised: the fast worker had to wait.
  EXPECT_GT(held, 0);
  EXPECT_GE((*stats)[0].max_clock_gap(), kStaleness);
}

TEST(Bsp, BackupWorkerLetsStepsGoOnWithoutAStalledWorker) {
  auto cluster = TestCluster::Start(
      1, {"--mode=bsp", "--backup_workers=1", "--worker_timeout=60s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Rank 1 computes a thousand times slower: alive (it heartbeats) but
  // stalled.
  auto stalled = StartWorker(
      **cluster, 1, 2,
      {"--mode=bsp", "--steps=1000", "--slowdown=1000", "--log_every=1ms"});
  ASSERT_TRUE(stalled.ok());
  // Rank 1 has joined and finished its first step before rank 0 starts:
  // otherwise a fast rank 0 may do all its steps before rank 1 is even
  // registered (it was so once the data plane made rank 0 fast).
  auto joined = (*stalled)->WaitForLine("rank 1 step", absl::Seconds(60));
  ASSERT_TRUE(joined.ok()) << joined.status() << (*stalled)->output();
  auto client = Client(**cluster);
  auto worker = StartWorker(**cluster, 0, 2, {"--mode=bsp", "--steps=40"});
  ASSERT_TRUE(worker.ok());
  auto done = Finish(**worker, absl::Seconds(60));
  ASSERT_TRUE(done.ok()) << done.status();
  auto stats = AdminClient(client->caller()).Stats(0);
  ASSERT_TRUE(stats.ok());
  // Rank 0 left when it was done; the stalled rank 1 is still live.
  EXPECT_EQ(stats->live_workers(), 1);
  EXPECT_GE(stats->steps_applied(), 40 * int64_t{stats->num_slices()});
  EXPECT_GT(stats->steps_short(), 0);
}

TEST(Bsp, SigkilledWorkerIsDroppedAfterTheTimeout) {
  auto cluster = TestCluster::Start(2, {"--mode=bsp", "--worker_timeout=2s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto victim = StartWorker(**cluster, 1, 2, {"--mode=bsp", "--steps=100000"});
  auto survivor = StartWorker(**cluster, 0, 2, {"--mode=bsp", "--steps=150"});
  ASSERT_TRUE(victim.ok() && survivor.ok());
  ASSERT_TRUE((*victim)->WaitForLine("rank 1 step", absl::Seconds(60)).ok())
      << (*victim)->output();
  (*victim)->Signal(SIGKILL);
  auto done = Finish(**survivor, absl::Seconds(90));
  ASSERT_TRUE(done.ok()) << done.status();
  EXPECT_EQ(Number(*done, "steps"), 150);
  auto client = Client(**cluster);
  auto stats = AdminClient(client->caller()).Stats(0);
  ASSERT_TRUE(stats.ok());
  bool dead = false;
  for (const auto& w : stats->workers()) dead |= w.rank() == 1 && !w.live();
  EXPECT_TRUE(dead);
  EXPECT_EQ(stats->live_workers(), 0);  // The survivor left when done.
  // Every one of the survivor's 150 steps was applied on every slice.
  EXPECT_GE(stats->steps_applied(), 150 * int64_t{stats->num_slices()});
}

TEST(Allreduce, DeadRankMakesTheOthersFailFastNamingIt) {
  auto cluster =
      TestCluster::Start(1, {"--mode=allreduce", "--worker_timeout=2s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // No replacement comes within the collective timeout.
  const std::vector<std::string> flags = {"--mode=allreduce", "--steps=100000",
                                          "--collective_timeout=5s"};
  auto victim = StartWorker(**cluster, 1, 2, flags);
  auto other = StartWorker(**cluster, 0, 2, flags);
  ASSERT_TRUE(victim.ok() && other.ok());
  ASSERT_TRUE((*victim)->WaitForLine("rank 1 step", absl::Seconds(60)).ok());
  (*victim)->Signal(SIGKILL);
  auto failed = (*other)->WaitForLine("failed:", absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << "rank 0 hung after rank 1 died: "
                           << failed.status();
  EXPECT_NE(failed->find("rank 1 stopped answering"), std::string::npos)
      << *failed;
  EXPECT_EQ(ExitCode(**other), 1);
}

TEST(Allreduce, RestartedJobResumesFromTheServersWeights) {
  auto cluster = TestCluster::Start(1, {"--mode=allreduce"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto first = RunTwoWorkers(
      **cluster, {"--mode=allreduce", "--steps=40", "--assign_every=10"});
  ASSERT_EQ(first.size(), 2u);
  // A new job on the same servers: it starts from the weights rank 0 handed
  // over at step 40, not from the initial ones, and at the job's clock.
  // --steps counts the job's clock: 5 more steps.
  auto second = RunTwoWorkers(**cluster, {"--mode=allreduce", "--steps=44"});
  ASSERT_EQ(second.size(), 2u);
  EXPECT_EQ(Text(second[0], "weights"), Text(second[1], "weights"));
  EXPECT_GE(Number(second[0], "clock"), 40 - 1 + 5);
  EXPECT_LT(Number(second[0], "first_loss"),
            0.8 * Number(first[0], "first_loss"))
      << "restarted job did not start from trained weights:\n"
      << first[0].DebugString() << "\n"
      << second[0].DebugString();
}

}  // namespace
}  // namespace asyncps::testing
