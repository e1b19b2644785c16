#include "common/stop_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"

namespace asyncps {
namespace {

int pipe_fds[2] = {-1, -1};

void OnSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  // Async-signal-safe; if the pipe is full a stop is already pending.
  (void)!write(pipe_fds[1], &b, 1);
  errno = saved;
}

}  // namespace

void InstallStopSignalHandlers() {
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) std::abort();
  fcntl(pipe_fds[1], F_SETFL, O_NONBLOCK);
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

void WakeStopWaiter() { OnSignal(0); }

int WaitForStopSignal(absl::Duration timeout, Clock* clock) {
  const absl::Time deadline = clock->Now() + timeout;
  while (true) {
    const absl::Duration left = deadline - clock->Now();
    if (left <= absl::ZeroDuration()) return -1;
    pollfd p{pipe_fds[0], POLLIN, 0};
    const absl::Duration slice = std::min(left, absl::Milliseconds(100));
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(slice)) + 1);
    if (ready > 0) return WaitForStopSignal();
    if (ready < 0 && errno != EINTR) return WaitForStopSignal();
  }
}

void ShutdownWithin(absl::Duration budget,
                    const std::function<void()>& shutdown,
                    const std::function<void(int)>& force_exit) {
  std::thread watchdog([budget, &force_exit] {
    const int sig = WaitForStopSignal(budget);
    if (sig == 0) return;  // Woken: the shutdown finished.
    if (force_exit) {
      force_exit(sig);
      return;
    }
    LOG(ERROR) << (sig > 0 ? absl::StrCat("second signal ", sig,
                                          ": exiting now, not drained")
                           : absl::StrCat("shutdown took over ",
                                          absl::FormatDuration(budget),
                                          ": exiting now, not drained"));
    google::FlushLogFiles(google::GLOG_INFO);
    std::fflush(nullptr);
    _exit(1);
  });
  shutdown();
  WakeStopWaiter();
  watchdog.join();
}

int WaitForStopSignal() {
  unsigned char b = 0;
  while (true) {
    const ssize_t n = read(pipe_fds[0], &b, 1);
    if (n == 1) return b;
    if (n < 0 && errno == EINTR) continue;
    return SIGTERM;  // The pipe broke: treat as a stop.
  }
}

}  // namespace asyncps
