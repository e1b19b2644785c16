// Waiting on what has no blocking wait with a deadline: NCCL's
// non-blocking communicators (ncclCommGetAsyncError) and a CUDA stream
// (cudaStreamQuery). NCCL's own blocking calls never time out, so a peer
// that died would hang the survivors; polling lets the caller give up at
// --collective_timeout and abort the communicator instead.
#ifndef ASYNCPS_WORKER_POLL_UNTIL_H_
#define ASYNCPS_WORKER_POLL_UNTIL_H_

#include <functional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace asyncps {

// Calls `done` until it returns true or an error (returned as is), or
// `deadline` passes: DEADLINE_EXCEEDED saying "<what> did not complete
// within the deadline". `done` is called at least once, so a deadline
// already past still sees a finished operation. Between calls it yields
// the CPU for the first millisecond (at most kSpins times), then sleeps
// 100 us at a time; time is `clock`'s (a test's ManualClock moves as it
// sleeps).
absl::Status PollUntil(const std::function<absl::StatusOr<bool>()>& done,
                       absl::Time deadline, absl::string_view what,
                       Clock* clock = Clock::Real());

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_POLL_UNTIL_H_
