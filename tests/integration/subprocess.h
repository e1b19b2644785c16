// Test helper: a child process with its stdout on a pipe, killed (SIGKILL)
// when the object dies, and also when the test process itself dies
// (PR_SET_PDEATHSIG), so no test leaves a process behind.
#ifndef ASYNCPS_TESTS_INTEGRATION_SUBPROCESS_H_
#define ASYNCPS_TESTS_INTEGRATION_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asyncps::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with the given arguments; stderr goes to the test's
  // stderr (it lands in the test log).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv);
  ~Subprocess();

  // Reads stdout lines until one contains `needle`, and returns it; fails
  // if the child closes stdout or `timeout` passes first.
  absl::StatusOr<std::string> WaitForLine(absl::string_view needle,
                                          absl::Duration timeout);
  // Everything read from stdout so far.
  const std::string& output() const { return output_; }

  void Signal(int sig);
  // Waits for exit; returns the wait status (see waitpid), or -1 on timeout.
  int Wait(absl::Duration timeout);
  pid_t pid() const { return pid_; }

 private:
  Subprocess(pid_t pid, int out_fd) : pid_(pid), out_fd_(out_fd) {}
  pid_t pid_;
  int out_fd_;
  bool reaped_ = false;
  int exit_status_ = 0;
  std::string buffer_;  // Read but not yet returned as a line.
  std::string output_;
};

// The path of a binary in this test's runfiles, e.g. "server/ps_server".
std::string RunfilePath(absl::string_view path);

// Starts a ps_server on 127.0.0.1 with a kernel-chosen port and returns it
// with `*port` set. `extra` flags are appended.
absl::StatusOr<std::unique_ptr<Subprocess>> StartServer(
    int shard, int num_shards, int* port,
    const std::vector<std::string>& extra = {});

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_SUBPROCESS_H_
