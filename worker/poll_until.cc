#include "worker/poll_until.h"

#include <sched.h>

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::Status PollUntil(const std::function<absl::StatusOr<bool>()>& done,
                       absl::Time deadline, absl::string_view what,
                       Clock* clock) {
  // Spins are counted too: a clock that moves only when slept on would
  // never end the first millisecond.
  constexpr int kSpins = 10000;
  const absl::Time spin_until = clock->Now() + absl::Milliseconds(1);
  for (int spins = 0;; ++spins) {
    absl::StatusOr<bool> finished = done();
    if (!finished.ok()) return finished.status();
    if (*finished) return absl::OkStatus();
    const absl::Time now = clock->Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete within the deadline"));
    }
    if (now < spin_until && spins < kSpins) {
      sched_yield();
    } else {
      clock->SleepFor(absl::Microseconds(100));
    }
  }
}

}  // namespace asyncps
