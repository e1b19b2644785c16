#include "tests/integration/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return absl::InternalError("pipe failed");
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) return absl::InternalError("fork failed");
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(127);
    dup2(fds[1], STDOUT_FILENO);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(fds[1]);
  return std::unique_ptr<Subprocess>(new Subprocess(pid, fds[0]));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  close(out_fd_);
}

absl::StatusOr<std::string> Subprocess::WaitForLine(absl::string_view needle,
                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    size_t nl;
    while ((nl = buffer_.find('\n')) != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      if (line.find(std::string(needle)) != std::string::npos) return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(
          absl::StrCat("no line with '", needle, "' from pid ", pid_));
    }
    pollfd p{out_fd_, POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready <= 0) continue;
    char buf[4096];
    const ssize_t n = read(out_fd_, buf, sizeof(buf));
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat(
          "pid ", pid_, " closed stdout before printing '", needle, "'"));
    }
    buffer_.append(buf, n);
    output_.append(buf, n);
  }
}

void Subprocess::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

int Subprocess::Wait(absl::Duration timeout) {
  if (reaped_) return exit_status_;
  // A pidfd becomes readable when the child exits, so poll() gives waitpid
  // the timeout it lacks.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    const int ready =
        poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(timeout)));
    close(pidfd);
    if (ready <= 0) return -1;
  }
  int status = 0;
  if (waitpid(pid_, &status, 0) != pid_) return -1;
  reaped_ = true;
  exit_status_ = status;
  return status;
}

std::string RunfilePath(absl::string_view path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return std::string(path);
  return absl::StrCat(srcdir, "/", workspace ? workspace : "asyncps", "/",
                      path);
}

absl::StatusOr<std::unique_ptr<Subprocess>> StartServer(
    int shard, int num_shards, int* port,
    const std::vector<std::string>& extra) {
  std::vector<std::string> argv = {RunfilePath("server/ps_server"),
                                   "--host=127.0.0.1", "--port=0",
                                   absl::StrCat("--shard=", shard),
                                   absl::StrCat("--num_shards=", num_shards)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto proc = Subprocess::Start(argv);
  if (!proc.ok()) return proc.status();
  auto line = (*proc)->WaitForLine("listening on", absl::Seconds(30));
  if (!line.ok()) return line.status();
  const size_t colon = line->rfind(':');
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(line->substr(colon + 1), port)) {
    return absl::InternalError(
        absl::StrCat("cannot parse port from '", *line, "'"));
  }
  return proc;
}

}  // namespace asyncps::testing
