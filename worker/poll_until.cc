#include "worker/poll_until.h"

#include <sched.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {

absl::Status PollUntil(const std::function<absl::StatusOr<bool>()>& done,
                       absl::Time deadline, absl::string_view what) {
  const absl::Time spin_until = absl::Now() + absl::Milliseconds(1);
  while (true) {
    absl::StatusOr<bool> finished = done();
    if (!finished.ok()) return finished.status();
    if (*finished) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete within the deadline"));
    }
    if (now < spin_until) {
      sched_yield();
    } else {
      absl::SleepFor(absl::Microseconds(100));
    }
  }
}

}  // namespace asyncps
