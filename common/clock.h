// The clock seam: code that reads time takes a Clock so tests can drive it.
#ifndef ASYNCPS_COMMON_CLOCK_H_
#define ASYNCPS_COMMON_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asyncps {

// Thread-safe source of the current time.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
  // Returns once `d` has passed on this clock.
  virtual void SleepFor(absl::Duration d) { absl::SleepFor(d); }
  // The process-wide real clock; never destroyed.
  static Clock* Real();
};

// A clock that only moves when told to. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }
  // Sleeping on a manual clock moves it: nothing really waits.
  void SleepFor(absl::Duration d) override { Advance(d); }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

inline Clock* Clock::Real() {
  class RealClock final : public Clock {
   public:
    absl::Time Now() const override { return absl::Now(); }
  };
  static RealClock* clock = new RealClock;
  return clock;
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CLOCK_H_
