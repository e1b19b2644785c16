// Under --config=tsan: proves that ThreadSanitizer sees absl::Mutex, i.e.
// that the test runs with the Abseil tests/tsan/abseil.sh built. Two
// threads add to one counter under one absl::Mutex: with Debian's own
// (uninstrumented) Abseil, TSAN reports this correctly locked code as a
// race and the test fails; with the instrumented one it passes. Any other
// report in the server's tests is then a real race.
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

namespace {

TEST(TsanCanary, CountingUnderAnAbslMutexIsNoRace) {
  absl::Mutex mu;
  int count = 0;
  auto add = [&] {
    for (int i = 0; i < 1000; ++i) {
      absl::MutexLock lock(&mu);
      ++count;
    }
  };
  std::thread other(add);
  add();
  other.join();
  absl::MutexLock lock(&mu);
  EXPECT_EQ(count, 2000);
}

}  // namespace
