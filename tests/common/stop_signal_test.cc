// ShutdownWithin: a shutdown that finishes is waited for; a second stop
// signal, or the budget running out, ends the wait at once (force_exit)
// while the shutdown is still stuck.
#include "common/stop_signal.h"

#include <signal.h>

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

class StopSignalTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { InstallStopSignalHandlers(); }
  // What an earlier case left in the pipe (a wake-up nobody read).
  void TearDown() override {
    while (WaitForStopSignal(absl::Milliseconds(20)) != -1) {
    }
  }
};

TEST_F(StopSignalTest, AShutdownThatFinishesIsWaitedFor) {
  std::atomic<int> forced{-2};
  bool ran = false;
  ShutdownWithin(
      absl::Seconds(30), [&ran] { ran = true; },
      [&forced](int sig) { forced = sig; });
  EXPECT_TRUE(ran);
  EXPECT_EQ(forced.load(), -2);  // Never called.
}

TEST_F(StopSignalTest, ASecondSignalEndsAStuckShutdownAtOnce) {
  absl::Notification released;
  std::atomic<int> forced{-2};
  ShutdownWithin(
      absl::Hours(1),
      [&] {
        raise(SIGTERM);                  // The operator's second signal.
        released.WaitForNotification();  // A drain that never ends.
      },
      [&](int sig) {
        forced = sig;
        released.Notify();  // The real one exits the process here.
      });
  EXPECT_EQ(forced.load(), SIGTERM);
}

TEST_F(StopSignalTest, TheBudgetEndsAStuckShutdown) {
  absl::Notification released;
  std::atomic<int> forced{-2};
  ShutdownWithin(
      absl::Milliseconds(100), [&] { released.WaitForNotification(); },
      [&](int sig) {
        forced = sig;
        released.Notify();
      });
  EXPECT_EQ(forced.load(), -1);
}

// The wait's timeout is on the given clock: a test's ManualClock moved
// past it ends the wait (within one 100 ms poll), not the hour it names.
TEST_F(StopSignalTest, TheTimeoutIsOnTheGivenClock) {
  ManualClock clock;
  std::atomic<int> got{-2};
  absl::Notification done;
  std::thread waiter([&] {
    got = WaitForStopSignal(absl::Hours(1), &clock);
    done.Notify();
  });
  // Moved until the waiter notices (it may not have read the clock yet).
  while (!done.WaitForNotificationWithTimeout(absl::Milliseconds(50))) {
    clock.Advance(absl::Hours(2));
  }
  waiter.join();
  EXPECT_EQ(got, -1);
}

}  // namespace
}  // namespace asyncps
