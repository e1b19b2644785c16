// Backoff: capped exponential backoff until a time limit, for retry loops
// (the client's retries of UNAVAILABLE shards, waiting for a model to be
// declared). Time goes through a Clock, so a ManualClock makes it instant in
// tests. Not thread-safe: one per retry loop.
#ifndef ASYNCPS_COMMON_BACKOFF_H_
#define ASYNCPS_COMMON_BACKOFF_H_

#include <algorithm>

#include "absl/time/time.h"
#include "common/clock.h"

namespace asyncps {

class Backoff {
 public:
  // Delays start at `initial`, double up to `max`; no wait may end later
  // than `limit` after construction. `clock` is borrowed.
  Backoff(absl::Duration initial, absl::Duration max, absl::Duration limit,
          Clock* clock = Clock::Real())
      : clock_(clock),
        delay_(initial),
        max_(max),
        give_up_(clock->Now() + limit) {}

  // Sleeps the next delay (at most `cap`) and returns true; or returns
  // false at once if that delay would end past the limit (the caller gives
  // up).
  bool Wait(absl::Duration cap = absl::InfiniteDuration()) {
    const absl::Duration delay = std::min(delay_, cap);
    if (clock_->Now() + delay > give_up_) return false;
    clock_->SleepFor(delay);
    delay_ = std::min(delay_ * 2, max_);
    return true;
  }

 private:
  Clock* const clock_;
  absl::Duration delay_;
  const absl::Duration max_;
  const absl::Time give_up_;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_BACKOFF_H_
