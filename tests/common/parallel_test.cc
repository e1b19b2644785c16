// ParallelFor calls fn once for each index, whatever the thread count.
#include "common/parallel.h"

#include <atomic>
#include <vector>

#include "gtest/gtest.h"

namespace asyncps {
namespace {

TEST(ParallelFor, CallsEveryIndexOnce) {
  for (size_t threads : {1, 2, 3, 8, 100}) {
    for (size_t n : {0, 1, 2, 7, 1000}) {
      std::vector<std::atomic<int>> calls(n);
      ParallelFor(n, threads, [&](size_t i) { calls[i].fetch_add(1); });
      for (size_t i = 0; i < n; ++i) {
        EXPECT_EQ(calls[i].load(), 1) << "n " << n << " threads " << threads;
      }
    }
  }
  EXPECT_GE(ParallelThreads(), 1u);
  EXPECT_LE(ParallelThreads(), 8u);
}

}  // namespace
}  // namespace asyncps
