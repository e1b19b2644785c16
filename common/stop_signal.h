// Turns SIGTERM and SIGINT into an event a thread can wait for. A handler
// (installed process-wide, so it works whichever thread the kernel picks,
// including threads that libraries such as OpenBLAS start before main)
// writes the signal number to a self-pipe; WaitForStopSignal reads it.
#ifndef ASYNCPS_COMMON_STOP_SIGNAL_H_
#define ASYNCPS_COMMON_STOP_SIGNAL_H_

#include <functional>

#include "absl/time/time.h"
#include "common/clock.h"

namespace asyncps {

// Installs the handlers. Call once, early in main.
void InstallStopSignalHandlers();

// Blocks until SIGTERM or SIGINT arrives, and returns its number; or until
// WakeStopWaiter is called, and returns 0.
// REQUIRES: InstallStopSignalHandlers() was called.
int WaitForStopSignal();
// The same, giving up after `timeout` on `clock`: then -1. The pipe is
// polled at most 100 ms at a time, so a clock a test moves is followed.
int WaitForStopSignal(absl::Duration timeout, Clock* clock = Clock::Real());

// Makes one WaitForStopSignal return 0 (a process that finished on its own
// ends the thread waiting for a signal).
void WakeStopWaiter();

// After the first stop signal: runs `shutdown` (a drain) and returns once it
// has, unless a second SIGTERM or SIGINT arrives first or `budget` passes:
// then calls `force_exit` with that signal's number, or -1 for the budget,
// from another thread, while `shutdown` is still running. The default
// force_exit logs why and ends the process at once (_exit(1)); a test's
// may return, and this then still waits for `shutdown`.
void ShutdownWithin(absl::Duration budget,
                    const std::function<void()>& shutdown,
                    const std::function<void(int)>& force_exit = nullptr);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STOP_SIGNAL_H_
