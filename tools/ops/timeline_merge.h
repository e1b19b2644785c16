// psctl timeline: the --timeline files of one run's processes (workers,
// shards, evaluator; common/timeline.h) merged into one Chrome trace, a
// summary of where each process's time went, and a gnuplot picture of a
// window of it. Files of processes that were killed (no closing bracket,
// perhaps a cut last line) are read up to their last whole event.
#ifndef ASYNCPS_TOOLS_OPS_TIMELINE_MERGE_H_
#define ASYNCPS_TOOLS_OPS_TIMELINE_MERGE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asyncps {

// One span of the merged trace, times in microseconds from its start.
struct MergedSpan {
  int process = 0;  // Index into MergedTimeline::processes.
  int64_t thread = 0;
  std::string name;
  std::string category;
  int64_t start_us = 0;
  int64_t duration_us = 0;
};

struct MergedTimeline {
  // Each file's process name ("worker 0", "shard 1"), in file order.
  std::vector<std::string> processes;
  // Named threads: (process, thread id) -> name.
  std::map<std::pair<int, int64_t>, std::string> threads;
  std::vector<MergedSpan> spans;
  int64_t dropped_lines = 0;  // Cut last lines of killed processes.
  // The merged trace: {"traceEvents": [...]}, one process per file.
  std::string json;
};

// Reads and merges `paths`. INVALID_ARGUMENT naming the file and line if
// one is not a timeline (a malformed event before its last line).
absl::StatusOr<MergedTimeline> MergeTimelines(
    const std::vector<std::string>& paths);

// Per process, the seconds its spans cover per category, and the share of
// the process's traced time, as a table.
std::string Summarize(const MergedTimeline& merged);

// A gnuplot script drawing the last `window` of the trace (or all of it if
// shorter): one row per process and thread, a box per span coloured by
// category, written as a PNG to `png`.
std::string PlotScript(const MergedTimeline& merged, absl::Duration window,
                       const std::string& png);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_TIMELINE_MERGE_H_
