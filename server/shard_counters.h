// ShardCounters: what a shard has done since it started (Stats), counted
// from many threads at once without a lock.
#ifndef ASYNCPS_SERVER_SHARD_COUNTERS_H_
#define ASYNCPS_SERVER_SHARD_COUNTERS_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "server/slice_state.h"

namespace asyncps {

// Staleness values 0 .. kStalenessBuckets-2 have their own bucket; the last
// bucket counts everything larger.
inline constexpr int kStalenessBuckets = 64;

// A snapshot of the counters.
struct ShardCounters {
  int64_t updates_applied = 0;
  int64_t pushes = 0;
  int64_t pulls = 0;
  int64_t rejected = 0;
  int64_t dropped_stale = 0;
  int64_t dropped_late = 0;
  int64_t steps_applied = 0;
  int64_t steps_short = 0;
  int64_t dropped_restarted = 0;
  int64_t duplicate_pushes = 0;
  std::vector<int64_t> staleness_histogram;
};

// The live counters. Thread-safe.
class ShardCounterSet {
 public:
  ShardCounterSet() : staleness_(kStalenessBuckets) {}

  void CountPush() { Add(pushes_); }
  void CountPull() { Add(pulls_); }
  void CountRejected() { Add(rejected_); }
  // A slice gradient computed against an earlier incarnation, dropped.
  void CountDroppedRestarted() { Add(dropped_restarted_); }
  // A retried push answered from the ledger.
  void CountDuplicatePush() { Add(duplicate_pushes_); }
  // One slice's outcome of a push (`bsp`: of a bsp push), or of a bsp step
  // completed later.
  void Count(const SliceOutcome& o, bool bsp) {
    if (o.applied) Add(updates_applied_);
    if (o.dropped) Add(bsp ? dropped_late_ : dropped_stale_);
    if (o.step_applied) {
      Add(steps_applied_);
      if (o.step_short) Add(steps_short_);
      Add(staleness_[0]);  // A bsp step is computed from the current weights.
    }
    if (!bsp) {
      const int64_t s = std::max<int64_t>(0, o.staleness);
      Add(staleness_[std::min<int64_t>(s, kStalenessBuckets - 1)]);
    }
  }

  ShardCounters Snapshot() const {
    ShardCounters c;
    c.updates_applied = Get(updates_applied_);
    c.pushes = Get(pushes_);
    c.pulls = Get(pulls_);
    c.rejected = Get(rejected_);
    c.dropped_stale = Get(dropped_stale_);
    c.dropped_late = Get(dropped_late_);
    c.steps_applied = Get(steps_applied_);
    c.steps_short = Get(steps_short_);
    c.dropped_restarted = Get(dropped_restarted_);
    c.duplicate_pushes = Get(duplicate_pushes_);
    for (const auto& b : staleness_) c.staleness_histogram.push_back(Get(b));
    return c;
  }

 private:
  static void Add(std::atomic<int64_t>& n) {
    n.fetch_add(1, std::memory_order_relaxed);
  }
  static int64_t Get(const std::atomic<int64_t>& n) {
    return n.load(std::memory_order_relaxed);
  }

  std::atomic<int64_t> updates_applied_{0};
  std::atomic<int64_t> pushes_{0};
  std::atomic<int64_t> pulls_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> dropped_stale_{0};
  std::atomic<int64_t> dropped_late_{0};
  std::atomic<int64_t> steps_applied_{0};
  std::atomic<int64_t> steps_short_{0};
  std::atomic<int64_t> dropped_restarted_{0};
  std::atomic<int64_t> duplicate_pushes_{0};
  std::vector<std::atomic<int64_t>> staleness_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_COUNTERS_H_
