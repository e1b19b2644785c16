#include "tools/ops/timeline_merge.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"

namespace asyncps {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// One event as read, before times are made relative.
struct Event {
  int process = 0;
  Struct fields;
};

double Number(const Struct& s, const char* key) {
  const auto it = s.fields().find(key);
  return it == s.fields().end() ? 0 : it->second.number_value();
}

std::string Text(const Struct& s, const char* key) {
  const auto it = s.fields().find(key);
  return it == s.fields().end() ? "" : it->second.string_value();
}

// A metadata event's args.name ("" if it has none).
std::string ArgName(const Struct& s) {
  const auto it = s.fields().find("args");
  return it == s.fields().end() ? "" : Text(it->second.struct_value(), "name");
}

// The events of one file, in order. A line that does not parse is an
// error, unless it is the last one (a killed process's cut write).
absl::Status ReadFile(const std::string& path, int process,
                      std::vector<Event>* out, int64_t* dropped) {
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": cannot read it"));
  }
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  if (lines.empty() || !absl::StartsWith(lines[0], "[")) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        ": not an asyncps timeline (want a JSON array of events, as "
        "--timeline writes)"));
  }
  for (size_t i = 0; i < lines.size(); ++i) {
    absl::string_view text = lines[i];
    if (i == 0) text = absl::StripPrefix(text, "[");
    text = absl::StripSuffix(absl::StripAsciiWhitespace(text), ",");
    if (text.empty() || text == "]") continue;
    Event e;
    e.process = process;
    const auto parsed = google::protobuf::util::JsonStringToMessage(
        std::string(text), &e.fields);
    if (!parsed.ok()) {
      if (i + 1 == lines.size()) {
        ++*dropped;
        break;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          path, ":", i + 1, ": not a trace event: ", parsed.ToString()));
    }
    out->push_back(std::move(e));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<MergedTimeline> MergeTimelines(
    const std::vector<std::string>& paths) {
  MergedTimeline merged;
  std::vector<Event> events;
  for (size_t p = 0; p < paths.size(); ++p) {
    const size_t first = events.size();
    absl::Status s =
        ReadFile(paths[p], static_cast<int>(p), &events, &merged.dropped_lines);
    if (!s.ok()) return s;
    std::string name = paths[p];
    for (size_t k = first; k < events.size(); ++k) {
      const Struct& f = events[k].fields;
      if (Text(f, "ph") == "M" && Text(f, "name") == "process_name") {
        name = ArgName(f);
      }
    }
    merged.processes.push_back(name);
  }
  int64_t origin = std::numeric_limits<int64_t>::max();
  for (const Event& e : events) {
    if (Text(e.fields, "ph") == "X") {
      origin = std::min(origin, static_cast<int64_t>(Number(e.fields, "ts")));
    }
  }
  if (origin == std::numeric_limits<int64_t>::max()) origin = 0;

  std::vector<std::string> lines;
  for (Event& e : events) {
    auto& f = *e.fields.mutable_fields();
    // One process per file, whatever the recorder's pid was (two machines
    // may share one).
    f["pid"].set_number_value(e.process + 1);
    const std::string ph = Text(e.fields, "ph");
    const auto tid = static_cast<int64_t>(Number(e.fields, "tid"));
    if (ph == "X") {
      const auto ts = static_cast<int64_t>(Number(e.fields, "ts")) - origin;
      f["ts"].set_number_value(static_cast<double>(ts));
      MergedSpan span;
      span.process = e.process;
      span.thread = tid;
      span.name = Text(e.fields, "name");
      span.category = Text(e.fields, "cat");
      span.start_us = ts;
      span.duration_us = static_cast<int64_t>(Number(e.fields, "dur"));
      merged.spans.push_back(std::move(span));
    } else if (ph == "M" && Text(e.fields, "name") == "thread_name") {
      merged.threads[{e.process, tid}] = ArgName(e.fields);
    }
    std::string json;
    (void)google::protobuf::util::MessageToJsonString(e.fields, &json);
    lines.push_back(std::move(json));
  }
  merged.json = absl::StrCat("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n",
                             absl::StrJoin(lines, ",\n"), "\n]}\n");
  return merged;
}

std::string Summarize(const MergedTimeline& merged) {
  // Seconds per (process, category), and each process's traced span.
  std::map<std::pair<int, std::string>, double> seconds;
  std::vector<std::pair<int64_t, int64_t>> extent(
      merged.processes.size(), {std::numeric_limits<int64_t>::max(),
                                std::numeric_limits<int64_t>::min()});
  for (const MergedSpan& s : merged.spans) {
    seconds[{s.process, s.category}] += s.duration_us / 1e6;
    auto& [lo, hi] = extent[s.process];
    lo = std::min(lo, s.start_us);
    hi = std::max(hi, s.start_us + s.duration_us);
  }
  std::string out = absl::StrFormat("%-12s %-22s %10s %8s\n", "process",
                                    "category", "seconds", "share");
  for (const auto& [key, secs] : seconds) {
    const auto& [lo, hi] = extent[key.first];
    const double traced = hi > lo ? (hi - lo) / 1e6 : 0;
    absl::StrAppendFormat(&out, "%-12s %-22s %10.3f %7.1f%%\n",
                          merged.processes[key.first], key.second, secs,
                          traced > 0 ? 100 * secs / traced : 0.0);
  }
  return out;
}

std::string PlotScript(const MergedTimeline& merged, absl::Duration window,
                       const std::string& png) {
  int64_t end = 0;
  for (const MergedSpan& s : merged.spans) {
    end = std::max(end, s.start_us + s.duration_us);
  }
  const int64_t from =
      std::max<int64_t>(0, end - absl::ToInt64Microseconds(window));
  // Rows: every (process, thread) with a span in the window, in order.
  std::set<std::pair<int, int64_t>> rows;
  std::set<std::string> categories;
  for (const MergedSpan& s : merged.spans) {
    if (s.start_us + s.duration_us < from) continue;
    rows.insert({s.process, s.thread});
    categories.insert(s.category);
  }
  std::map<std::pair<int, int64_t>, int> row_of;
  std::string ytics;
  for (const auto& row : rows) {
    const int y = static_cast<int>(row_of.size());
    row_of[row] = y;
    const auto named = merged.threads.find(row);
    const std::string label = absl::StrCat(
        merged.processes[row.first], " ",
        named != merged.threads.end() ? named->second
                                      : absl::StrCat("thread ", row.second));
    absl::StrAppend(&ytics, y == 0 ? "" : ", ", "\"", label, "\" ", y);
  }
  std::string script = absl::StrCat(
      "set terminal pngcairo size 1400,", 120 + 28 * rows.size(),
      " noenhanced\nset output '", png, "'\n",
      "set title 'asyncps timeline: the last ",
      absl::FormatDuration(absl::Microseconds(end - from)), " of the run (",
      merged.processes.size(), " processes)'\n",
      "set xlabel 'seconds'\nset ytics (", ytics, ")\n",
      "set yrange [-0.6:", rows.size() - 0.4, "]\nset grid x\n",
      "set key outside right\nset style fill solid 0.8 noborder\n");
  int block = 0;
  std::string plot = "plot ";
  for (const std::string& cat : categories) {
    absl::StrAppend(&script, "$c", block, " << EOD\n");
    for (const MergedSpan& s : merged.spans) {
      if (s.category != cat || s.start_us + s.duration_us < from) continue;
      const double x0 = (std::max(s.start_us, from) - from) / 1e6;
      const double x1 = (s.start_us + s.duration_us - from) / 1e6;
      const int y = row_of[{s.process, s.thread}];
      absl::StrAppendFormat(&script, "%.6f %d %.6f %.6f %.2f %.2f\n",
                            (x0 + x1) / 2, y, x0, x1, y - 0.4, y + 0.4);
    }
    absl::StrAppend(&script, "EOD\n");
    absl::StrAppend(&plot, block == 0 ? "" : ", ", "$c", block,
                    " using 1:2:3:4:5:6 with boxxyerror title '", cat, "'");
    ++block;
  }
  if (block == 0) plot = "plot 0 notitle";
  return absl::StrCat(script, plot, "\n");
}

}  // namespace asyncps
