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
#include "google/protobuf/struct.pb.h"
#include "tests/testing/temp_dir.h"  // RunfilePath

namespace asyncps::testing {

class Subprocess {
 public:
  // Starts `argv[0]` with the given arguments; stderr goes to the test's
  // stderr (it lands in the test log). `result_file`, if given, names the
  // file the child writes its result to (a ps_worker's --result_json).
  static absl::StatusOr<std::unique_ptr<Subprocess>> Start(
      const std::vector<std::string>& argv, std::string result_file = "");
  ~Subprocess();

  // Reads stdout lines until one contains `needle`, and returns it; fails
  // if the child closes stdout or `timeout` passes first.
  absl::StatusOr<std::string> WaitForLine(absl::string_view needle,
                                          absl::Duration timeout);
  // Everything read from stdout so far.
  const std::string& output() const { return output_; }
  const std::string& result_file() const { return result_file_; }

  // Waits until `path` exists (created whole, or renamed into place, in a
  // directory that exists) and returns its contents; fails if the child
  // exits first or `timeout` passes. Reads stdout meanwhile.
  absl::StatusOr<std::string> WaitForFile(const std::string& path,
                                          absl::Duration timeout);

  void Signal(int sig);
  // Waits for exit, reading stdout meanwhile (a child that fills the pipe
  // cannot block); returns the wait status (see waitpid), or -1 on timeout.
  int Wait(absl::Duration timeout);
  pid_t pid() const { return pid_; }

 private:
  Subprocess(pid_t pid, int out_fd, std::string result_file)
      : pid_(pid), out_fd_(out_fd), result_file_(std::move(result_file)) {}
  // Appends what stdout has (up to one read); false at end of file.
  bool ReadSome();
  // Reaps the child if it has exited; true if it has.
  bool Reap(bool block);
  pid_t pid_;
  int out_fd_;
  bool out_open_ = true;
  std::string result_file_;
  bool reaped_ = false;
  int exit_status_ = 0;
  std::string buffer_;  // Read but not yet returned as a line.
  std::string output_;
};

// Starts a ps_server on 127.0.0.1 with a kernel-chosen port and returns it
// with `*port` set, read from its --ready_file once it serves. `extra`
// flags are appended.
absl::StatusOr<std::unique_ptr<Subprocess>> StartServer(
    int shard, int num_shards, int* port,
    const std::vector<std::string>& extra = {});

// A TCP port nothing listens on now on 127.0.0.1 (the kernel's pick,
// released): for a program that cannot report the port it chose.
int FreePort();

// `text` (a --ready_file's or --result_json's) as a JSON object.
absl::StatusOr<google::protobuf::Struct> ParseJson(const std::string& text);

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_SUBPROCESS_H_
