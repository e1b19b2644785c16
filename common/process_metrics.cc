#include "common/process_metrics.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/build_info.h"
#include "common/metric_families.h"

namespace asyncps {
namespace {

using prometheus::MetricFamily;
using prometheus::MetricType;

std::string ReadAll(const char* path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Seconds since the epoch at which the kernel booted (/proc/stat's btime).
double BootTime() {
  for (absl::string_view line : absl::StrSplit(ReadAll("/proc/stat"), '\n')) {
    double t = 0;
    if (absl::ConsumePrefix(&line, "btime ") && absl::SimpleAtod(line, &t)) {
      return t;
    }
  }
  return 0;
}

int OpenFds() {
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return -1;
  int n = 0;
  while (const dirent* e = readdir(dir)) {
    if (e->d_name[0] != '.') ++n;
  }
  closedir(dir);
  return n - 1;  // Not the one opendir holds.
}

void Add(std::vector<MetricFamily>* out, const char* name, const char* help,
         MetricType type, double value) {
  out->push_back(OneSample(name, help, type, value));
}

}  // namespace

uint64_t ResidentBytes() {
  const std::vector<std::string> f =
      absl::StrSplit(ReadAll("/proc/self/statm"), ' ', absl::SkipEmpty());
  uint64_t pages = 0;
  if (f.size() < 2 || !absl::SimpleAtoi(f[1], &pages)) return 0;
  return pages * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

uint64_t CgroupMemoryLimitBytes() {
  for (const char* path : {"/sys/fs/cgroup/memory.max",
                           "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    uint64_t limit = 0;
    const std::string text(absl::StripAsciiWhitespace(ReadAll(path)));
    // "max", or v1's "no limit" (a number near 2^63).
    if (absl::SimpleAtoi(text, &limit) && limit < (uint64_t{1} << 62)) {
      return limit;
    }
  }
  return 0;
}

std::vector<MetricFamily> ProcessMetrics::Collect() const {
  std::vector<MetricFamily> out;
  {
    MetricFamily f = Family("asyncps_build_info",
                            "What this binary was built from; the value is 1.",
                            MetricType::Gauge);
    f.metric.push_back(
        Sample(MetricType::Gauge, 1,
               {{"version", kAsyncpsVersion}, {"commit", kAsyncpsCommit}}));
    out.push_back(std::move(f));
  }
  // /proc/self/stat: the fields after the command's closing parenthesis
  // (the command itself may hold spaces), numbered from 3 (state).
  const std::string stat = ReadAll("/proc/self/stat");
  const size_t paren = stat.rfind(')');
  if (paren == std::string::npos) return out;
  const std::vector<absl::string_view> f = absl::StrSplit(
      absl::string_view(stat).substr(paren + 2), ' ', absl::SkipEmpty());
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  const double page = static_cast<double>(sysconf(_SC_PAGESIZE));
  double utime = 0, stime = 0, start = 0, vsize = 0, rss = 0;
  // utime 14, stime 15, starttime 22, vsize 23, rss 24 (proc(5)).
  if (f.size() < 22 || !absl::SimpleAtod(f[14 - 3], &utime) ||
      !absl::SimpleAtod(f[15 - 3], &stime) ||
      !absl::SimpleAtod(f[22 - 3], &start) ||
      !absl::SimpleAtod(f[23 - 3], &vsize) ||
      !absl::SimpleAtod(f[24 - 3], &rss)) {
    return out;
  }
  Add(&out, "process_cpu_seconds_total",
      "User and system CPU time spent, in seconds.", MetricType::Counter,
      (utime + stime) / tick);
  Add(&out, "process_start_time_seconds",
      "Start time of the process since the epoch, in seconds.",
      MetricType::Gauge, BootTime() + start / tick);
  Add(&out, "process_resident_memory_bytes", "Resident memory size in bytes.",
      MetricType::Gauge, rss * page);
  Add(&out, "process_virtual_memory_bytes", "Virtual memory size in bytes.",
      MetricType::Gauge, vsize);
  Add(&out, "process_open_fds", "Number of open file descriptors.",
      MetricType::Gauge, OpenFds());
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    Add(&out, "process_max_fds", "Maximum number of open file descriptors.",
        MetricType::Gauge, static_cast<double>(limit.rlim_cur));
  }
  return out;
}

}  // namespace asyncps
