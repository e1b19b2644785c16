// A Chrome trace-event file of one process (--timeline=FILE): a complete
// event ("ph":"X") per span, written when the span ends, one per line, in
// the JSON array format that chrome://tracing and Perfetto read. Times are
// microseconds of the wall clock, so files of processes on one machine
// line up (across machines, as well as their clocks agree). Close ends the
// array; a killed process leaves it open, which psctl timeline accepts (as
// Chrome does). Thread-safe.
#ifndef ASYNCPS_COMMON_TIMELINE_H_
#define ASYNCPS_COMMON_TIMELINE_H_

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace asyncps {

class Timeline {
 public:
  using Args = std::initializer_list<std::pair<absl::string_view, int64_t>>;

  // Creates (truncates) `path` and names the process `process` ("shard 0",
  // "worker 3"). INVALID_ARGUMENT naming --timeline if it cannot.
  static absl::StatusOr<std::unique_ptr<Timeline>> Open(
      const std::string& path, const std::string& process);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A span [start, end) called `name`, of category `cat` (what psctl
  // timeline colours by), with integer `args`, on the calling thread or,
  // with `lane` > 0, on lane `lane` (a row of its own, e.g. held pulls).
  void Span(absl::string_view name, absl::string_view cat, absl::Time start,
            absl::Time end, Args args = {}, int lane = 0);

  // Renames the process (the last name given is the one psctl shows).
  void NameProcess(absl::string_view name);

  // Names the calling thread's row (or, with `lane` > 0, that lane's).
  void NameThread(absl::string_view name, int lane = 0);

  // Ends the array and closes the file; later spans are dropped.
  // Idempotent.
  void Close();

 private:
  Timeline(std::FILE* file, int pid);

  const int pid_;
  absl::Mutex mu_;
  std::FILE* file_ ABSL_GUARDED_BY(mu_);
};

// A span from construction to destruction; nothing when `timeline` is null.
class ScopedSpan {
 public:
  ScopedSpan(Timeline* timeline, absl::string_view name, absl::string_view cat)
      : timeline_(timeline),
        name_(name),
        cat_(cat),
        start_(timeline == nullptr ? absl::InfinitePast() : absl::Now()) {}
  ~ScopedSpan() {
    if (timeline_ == nullptr) return;
    if (key_.empty()) {
      timeline_->Span(name_, cat_, start_, absl::Now());
    } else {
      timeline_->Span(name_, cat_, start_, absl::Now(), {{key_, arg_}});
    }
  }
  ScopedSpan(const ScopedSpan&) = delete;
  ScopedSpan& operator=(const ScopedSpan&) = delete;

  // One number shown with the span (bytes, slices, a layer).
  void set_arg(absl::string_view key, int64_t value) {
    key_ = key;
    arg_ = value;
  }

 private:
  Timeline* const timeline_;
  const absl::string_view name_;
  const absl::string_view cat_;
  const absl::Time start_;
  absl::string_view key_;
  int64_t arg_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_TIMELINE_H_
