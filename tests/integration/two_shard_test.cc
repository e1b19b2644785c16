// Two real ps_server processes, eight client threads pushing at once: no
// update may be lost, and versions must count every push.
#include <thread>
#include <vector>

#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

constexpr int kThreads = 8;
constexpr int kPushes = 100;

// Integer-valued gradients, so every sum is exact in f32 whatever the order.
float Grad(int thread, int push, size_t element) {
  return static_cast<float>((thread * 7 + push * 3 + element) % 5) - 2.0f;
}

// Thread `t`'s work: its own client (separate processes would have one
// each) joins as rank t and declares `spec`, then pulls the three tensors
// and pushes Grad(t, p, ...) for p = 0 .. kPushes - 1. The first failure.
absl::Status PullAndPushAsRank(const PsClientOptions& options,
                               const v1::ModelSpec& spec,
                               const Partition& partition, int t) {
  const std::vector<int> tensors = {0, 1, 2};
  auto client = PsClient::Create(options);
  if (!client.ok()) return client.status();
  absl::Status result = (*client)->Join(t, kThreads + 1);
  if (result.ok()) result = (*client)->DeclareModel(spec);
  std::vector<std::vector<float>> weights(3), grads(3);
  for (int k = 0; k < 3; ++k) {
    weights[k].resize(partition.tensor_elements(k));
    grads[k].resize(partition.tensor_elements(k));
  }
  std::vector<SliceVersion> versions;
  for (int p = 0; p < kPushes && result.ok(); ++p) {
    result = (*client)->Pull(tensors, &weights, &versions, t, p);
    if (!result.ok()) break;
    for (int k = 0; k < 3; ++k) {
      for (size_t e = 0; e < grads[k].size(); ++e) {
        grads[k][e] = Grad(t, p, e);
      }
    }
    result = (*client)->Push(tensors, grads, versions, t, p + 1, nullptr);
  }
  return result;
}

TEST(TwoShards, ConcurrentPushesLoseNoUpdate) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // 3000 + 200 + 10 elements in 1 KiB slices: a few dozen slices per shard.
  v1::ModelSpec spec =
      ConstantSpec({{100, 30}, {200}, {10}}, 2, 1000.0f, 1.0f, 1024);
  PsClientOptions options;
  options.servers = (*cluster)->servers();
  auto setup = PsClient::Create(options);
  ASSERT_TRUE(setup.ok());
  // Threads are ranks 0 .. kThreads - 1; the setup client the last one.
  ASSERT_TRUE((*setup)->Join(kThreads, kThreads + 1).ok());
  ASSERT_TRUE((*setup)->DeclareModel(spec).ok());
  const std::vector<int> tensors = {0, 1, 2};
  const Partition& partition = (*setup)->partition();
  const int num_slices = static_cast<int>(partition.slices().size());

  std::vector<std::thread> threads;
  std::vector<absl::Status> results(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      results[t] = PullAndPushAsRank(options, spec, partition, t);
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_TRUE(results[t].ok()) << "thread " << t << ": " << results[t];
  }

  std::vector<std::vector<float>> weights(3);
  for (int k = 0; k < 3; ++k) weights[k].resize(partition.tensor_elements(k));
  std::vector<SliceVersion> versions;
  ASSERT_TRUE((*setup)->Pull(tensors, &weights, &versions, -1, 0).ok());
  for (int k = 0; k < 3; ++k) {
    for (size_t e = 0; e < weights[k].size(); ++e) {
      double expected = 1000.0;
      for (int t = 0; t < kThreads; ++t) {
        for (int p = 0; p < kPushes; ++p) expected -= Grad(t, p, e);
      }
      ASSERT_EQ(weights[k][e], static_cast<float>(expected))
          << "tensor " << k << " element " << e;
    }
  }
  for (int i = 0; i < num_slices; ++i) {
    EXPECT_EQ(versions[i].version, kThreads * kPushes) << "slice " << i;
  }
  auto stats = AdminClient((*setup)->caller()).StatsAll();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t applied = 0, pushes = 0;
  for (const auto& s : *stats) {
    applied += s.updates_applied();
    pushes += s.pushes();
    EXPECT_GT(s.num_slices(), 0u) << "shard " << s.shard() << " holds nothing";
  }
  EXPECT_EQ(applied, int64_t{kThreads} * kPushes * num_slices);
  EXPECT_EQ(pushes, 2 * kThreads * kPushes);  // One RPC per shard per push.
}

TEST(TwoShards, SigtermShutsDownCleanly) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  for (int s = 0; s < 2; ++s) {
    (*cluster)->process(s).Signal(SIGTERM);
    const int status = (*cluster)->process(s).Wait(absl::Seconds(20));
    ASSERT_NE(status, -1) << "shard " << s << " did not exit on SIGTERM";
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "shard " << s << " wait status " << status;
  }
}

}  // namespace
}  // namespace asyncps::testing
