#include "common/timeline.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace asyncps {
namespace {

// A JSON string's body: quotes, backslashes and control characters escaped.
std::string Escape(absl::string_view s) {
  std::string out;
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

int ThreadId() { return static_cast<int>(syscall(SYS_gettid)); }

}  // namespace

absl::StatusOr<std::unique_ptr<Timeline>> Timeline::Open(
    const std::string& path, const std::string& process) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--timeline=", path, ": cannot write it: ", std::strerror(errno)));
  }
  const int pid = static_cast<int>(getpid());
  // The first line opens the array and names the process.
  absl::FPrintF(f,
                "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
                "\"tid\":0,\"args\":{\"name\":\"%s\"}}",
                pid, Escape(process));
  std::fflush(f);
  return std::unique_ptr<Timeline>(new Timeline(f, pid));
}

Timeline::Timeline(std::FILE* file, int pid) : pid_(pid), file_(file) {}

Timeline::~Timeline() { Close(); }

void Timeline::Span(absl::string_view name, absl::string_view cat,
                    absl::Time start, absl::Time end, Args args, int lane) {
  std::string line = absl::StrFormat(
      ",\n{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"ts\":%d,\"dur\":%d,"
      "\"pid\":%d,\"tid\":%d,\"args\":{",
      Escape(name), Escape(cat), absl::ToUnixMicros(start),
      absl::ToInt64Microseconds(end - start), pid_,
      lane > 0 ? lane : ThreadId());
  const char* sep = "";
  for (const auto& [key, value] : args) {
    absl::StrAppend(&line, sep, "\"", Escape(key), "\":", value);
    sep = ",";
  }
  line += "}}";
  absl::MutexLock lock(&mu_);
  if (file_ != nullptr) std::fwrite(line.data(), 1, line.size(), file_);
}

void Timeline::NameProcess(absl::string_view name) {
  const std::string line = absl::StrFormat(
      ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
      "\"args\":{\"name\":\"%s\"}}",
      pid_, Escape(name));
  absl::MutexLock lock(&mu_);
  if (file_ != nullptr) std::fwrite(line.data(), 1, line.size(), file_);
}

void Timeline::NameThread(absl::string_view name, int lane) {
  const std::string line = absl::StrFormat(
      ",\n{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,"
      "\"args\":{\"name\":\"%s\"}}",
      pid_, lane > 0 ? lane : ThreadId(), Escape(name));
  absl::MutexLock lock(&mu_);
  if (file_ != nullptr) std::fwrite(line.data(), 1, line.size(), file_);
}

void Timeline::Close() {
  absl::MutexLock lock(&mu_);
  if (file_ == nullptr) return;
  std::fputs("\n]\n", file_);
  std::fclose(file_);
  file_ = nullptr;
}

}  // namespace asyncps
