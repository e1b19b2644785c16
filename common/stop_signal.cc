#include "common/stop_signal.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>

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
