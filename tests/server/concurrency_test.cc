// The shard's store under concurrent pushes and pulls from several threads,
// as the gRPC and data-plane threads drive it: every push is applied once,
// and every pull sees whole weights. Meant for the sanitizers as much as
// for its own checks (tests/run_tests.sh runs it under ASAN+UBSAN).
#include <thread>
#include <vector>

#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "server/shard_store.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

TEST(Concurrency, PushesFromManyThreadsAreEachAppliedOnce) {
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(testing::SmallModel()).ok());
  constexpr int kThreads = 4;
  constexpr int kPushes = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < kPushes; ++i) {
        v1::PushResponse pushed;
        ASSERT_TRUE(
            store.Push(testing::SmallModelPush(0.001f, 0, t, i + 1), &pushed)
                .ok());
        v1::PullRequest pull;
        *pull.add_slices() = testing::SmallModelKey();
        v1::PullResponse pulled;
        ASSERT_TRUE(store.Pull(pull, &pulled).ok());
        // Whole weights: all four elements moved together.
        std::vector<float> w(4);
        DecodeF32(pulled.slices(0).data(), absl::MakeSpan(w));
        for (float x : w) ASSERT_EQ(x, w[0]);
      }
    });
  }
  for (auto& t : threads) t.join();
  v1::PullRequest pull;
  *pull.add_slices() = testing::SmallModelKey();
  v1::PullResponse pulled;
  ASSERT_TRUE(store.Pull(pull, &pulled).ok());
  EXPECT_EQ(pulled.slices(0).version(), kThreads * kPushes);
}

}  // namespace
}  // namespace asyncps
