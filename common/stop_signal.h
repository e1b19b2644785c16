// Turns SIGTERM and SIGINT into an event a thread can wait for. A handler
// (installed process-wide, so it works whichever thread the kernel picks,
// including threads that libraries such as OpenBLAS start before main)
// writes the signal number to a self-pipe; WaitForStopSignal reads it.
#ifndef ASYNCPS_COMMON_STOP_SIGNAL_H_
#define ASYNCPS_COMMON_STOP_SIGNAL_H_

namespace asyncps {

// Installs the handlers. Call once, early in main.
void InstallStopSignalHandlers();

// Blocks until SIGTERM or SIGINT arrives, and returns its number; or until
// WakeStopWaiter is called, and returns 0.
// REQUIRES: InstallStopSignalHandlers() was called.
int WaitForStopSignal();

// Makes one WaitForStopSignal return 0 (a process that finished on its own
// ends the thread waiting for a signal).
void WakeStopWaiter();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STOP_SIGNAL_H_
