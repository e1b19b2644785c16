#include "tests/integration/subprocess.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {

absl::StatusOr<std::unique_ptr<Subprocess>> Subprocess::Start(
    const std::vector<std::string>& argv, std::string result_file) {
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
  return std::unique_ptr<Subprocess>(
      new Subprocess(pid, fds[0], std::move(result_file)));
}

Subprocess::~Subprocess() {
  if (!reaped_) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  close(out_fd_);
}

bool Subprocess::ReadSome() {
  char buf[4096];
  const ssize_t n = read(out_fd_, buf, sizeof(buf));
  if (n <= 0) {
    out_open_ = false;
    return false;
  }
  buffer_.append(buf, n);
  output_.append(buf, n);
  return true;
}

bool Subprocess::Reap(bool block) {
  if (reaped_) return true;
  int status = 0;
  if (waitpid(pid_, &status, block ? 0 : WNOHANG) != pid_) return false;
  reaped_ = true;
  exit_status_ = status;
  // What the child wrote before it exited is still in the pipe.
  pollfd p{out_fd_, POLLIN, 0};
  while (out_open_ && poll(&p, 1, 0) > 0 && ReadSome()) {
  }
  return true;
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
    if (!ReadSome()) {
      return absl::UnavailableError(absl::StrCat(
          "pid ", pid_, " closed stdout before printing '", needle, "'"));
    }
  }
}

absl::StatusOr<std::string> Subprocess::WaitForFile(const std::string& path,
                                                    absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // inotify says when a file lands in the directory: no polling loop.
  const int watch = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (watch < 0) return absl::InternalError("inotify_init1 failed");
  const std::string dir = std::filesystem::path(path).parent_path().string();
  if (inotify_add_watch(watch, dir.c_str(), IN_MOVED_TO | IN_CLOSE_WRITE) < 0) {
    close(watch);
    return absl::InternalError(absl::StrCat("cannot watch ", dir));
  }
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  absl::StatusOr<std::string> result = absl::DeadlineExceededError(
      absl::StrCat("pid ", pid_, " wrote no ", path, " within ",
                   absl::FormatDuration(timeout)));
  while (true) {
    if (auto text = ReadFile(path)) {
      result = *std::move(text);
      break;
    }
    if (Reap(false)) {
      result = absl::UnavailableError(
          absl::StrCat("pid ", pid_, " exited (status ", exit_status_,
                       ") before writing ", path, "; its output:\n", output_));
      break;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd p[3] = {{watch, POLLIN, 0},
                   {out_open_ ? out_fd_ : -1, POLLIN, 0},
                   {pidfd, POLLIN, 0}};
    if (poll(p, 3, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <=
        0) {
      continue;
    }
    if (p[0].revents != 0) {
      char events[4096];
      while (read(watch, events, sizeof(events)) > 0) {
      }
    }
    if (p[1].revents != 0) ReadSome();
  }
  if (pidfd >= 0) close(pidfd);
  close(watch);
  return result;
}

void Subprocess::Signal(int sig) {
  if (!reaped_) kill(pid_, sig);
}

int Subprocess::Wait(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  // A pidfd becomes readable when the child exits, so poll() gives waitpid
  // the timeout it lacks; stdout is drained meanwhile.
  const int pidfd = static_cast<int>(syscall(SYS_pidfd_open, pid_, 0));
  while (!Reap(pidfd < 0)) {
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) break;
    pollfd p[2] = {{pidfd, POLLIN, 0}, {out_open_ ? out_fd_ : -1, POLLIN, 0}};
    if (poll(p, 2, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) > 0 &&
        p[1].revents != 0) {
      ReadSome();
    }
  }
  if (pidfd >= 0) close(pidfd);
  return reaped_ ? exit_status_ : -1;
}

int FreePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

absl::StatusOr<std::unique_ptr<Subprocess>> StartServer(
    int shard, int num_shards, int* port,
    const std::vector<std::string>& extra) {
  const std::string ready = UniqueTempPath("ready", ".json");
  std::vector<std::string> argv = {RunfilePath("server/ps_server"),
                                   "--host=127.0.0.1",
                                   "--port=0",
                                   absl::StrCat("--shard=", shard),
                                   absl::StrCat("--num_shards=", num_shards),
                                   absl::StrCat("--ready_file=", ready)};
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto proc = Subprocess::Start(argv);
  if (!proc.ok()) return proc.status();
  auto text = (*proc)->WaitForFile(ready, absl::Seconds(30));
  if (!text.ok()) return text.status();
  std::filesystem::remove(ready);
  auto json = ParseJson(*text);
  if (!json.ok()) return json.status();
  const auto at = json->fields().find("port");
  if (at == json->fields().end() || at->second.number_value() <= 0) {
    return absl::InternalError(
        absl::StrCat("no port in --ready_file: ", *text));
  }
  *port = static_cast<int>(at->second.number_value());
  return proc;
}

absl::StatusOr<google::protobuf::Struct> ParseJson(const std::string& text) {
  google::protobuf::Struct json;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &json);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not JSON (", status.ToString(), "): ", text));
  }
  return json;
}

}  // namespace asyncps::testing
