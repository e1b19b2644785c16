// PollUntil, the bounded wait the NCCL collective uses on what has no
// deadline of its own: it returns when the operation finishes, passes an
// operation's error through, and gives up at the deadline (having looked
// at least once).
#include "worker/poll_until.h"

#include "absl/time/clock.h"
#include "common/clock.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

TEST(PollUntil, ReturnsOnceTheOperationFinishes) {
  int calls = 0;
  const absl::Status s =
      PollUntil([&calls]() -> absl::StatusOr<bool> { return ++calls == 5; },
                absl::InfiniteFuture(), "the op");
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_EQ(calls, 5);
}

TEST(PollUntil, PassesAnOperationsErrorThrough) {
  const absl::Status s = PollUntil(
      []() -> absl::StatusOr<bool> {
        return absl::UnavailableError("ncclAllReduce: remote process exited");
      },
      absl::InfiniteFuture(), "the op");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(s.message(), "ncclAllReduce: remote process exited");
}

TEST(PollUntil, GivesUpAtTheDeadlineAfterLookingOnce) {
  int calls = 0;
  absl::Status s = PollUntil(
      [&calls]() -> absl::StatusOr<bool> {
        ++calls;
        return false;  // A peer that never comes.
      },
      absl::InfinitePast(), "the all-reduce");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "the all-reduce did not complete within the deadline");
  EXPECT_EQ(calls, 1);
  // Finished operations pass even with the deadline gone.
  s = PollUntil([]() -> absl::StatusOr<bool> { return true; },
                absl::InfinitePast(), "the op");
  EXPECT_TRUE(s.ok());
  // A real wait ends near its deadline, not much later.
  const absl::Time start = absl::Now();
  s = PollUntil([]() -> absl::StatusOr<bool> { return false; },
                start + absl::Milliseconds(30), "the op");
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(absl::Now() - start, absl::Milliseconds(30));
}

// On the Env's clock: a ManualClock moves as PollUntil sleeps on it, so a
// 5 s deadline passes at once and exactly.
TEST(PollUntil, WaitsOnTheGivenClock) {
  ManualClock clock(absl::UnixEpoch());
  int calls = 0;
  const absl::Status s = PollUntil(
      [&calls]() -> absl::StatusOr<bool> {
        ++calls;
        return false;
      },
      absl::UnixEpoch() + absl::Seconds(5), "the op", &clock);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_GE(clock.Now(), absl::UnixEpoch() + absl::Seconds(5));
  EXPECT_LT(clock.Now(),
            absl::UnixEpoch() + absl::Seconds(5) + absl::Milliseconds(1));
  EXPECT_GT(calls, 1000);
}

}  // namespace
}  // namespace asyncps
