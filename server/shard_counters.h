// ShardCounterSet: what a shard has done since it started (Stats), counted
// from many threads at once without a lock. A counter is one ShardCounter;
// its metric, help text and Stats field are its one row in
// server/edge/shard_stats.cc, which fails to compile unless every counter
// has exactly one row.
#ifndef ASYNCPS_SERVER_SHARD_COUNTERS_H_
#define ASYNCPS_SERVER_SHARD_COUNTERS_H_

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "server/slice_state.h"

namespace asyncps {

// What each counts is its row's help text (server/edge/shard_stats.cc).
enum class ShardCounter : int {
  kPushes,
  kPulls,
  kRejected,
  kUpdatesApplied,
  kDuplicatePushes,
  kStepsApplied,
  kStepsShort,
  kDroppedStale,
  kDroppedLate,
  kDroppedRestarted,
  kCompensated,
  kUncompensated,
  kCount,  // Not a counter: how many there are; new ones go above.
};
inline constexpr int kNumShardCounters = static_cast<int>(ShardCounter::kCount);

// Staleness values 0 .. kStalenessBuckets-2 have their own bucket; the last
// bucket counts everything larger.
inline constexpr int kStalenessBuckets = 64;

// A snapshot of the counters.
struct ShardCounters {
  int64_t operator[](ShardCounter c) const {
    return values[static_cast<size_t>(c)];
  }

  std::array<int64_t, kNumShardCounters> values{};
  std::vector<int64_t> staleness_histogram;
};

// The live counters. Thread-safe.
class ShardCounterSet {
 public:
  ShardCounterSet() : staleness_(kStalenessBuckets) {}

  void Add(ShardCounter c) { Bump(counters_[static_cast<size_t>(c)]); }
  // One slice's outcome of a push (`bsp`: of a bsp push), or of a bsp step
  // completed later.
  void Count(const SliceOutcome& o, bool bsp) {
    if (o.applied) Add(ShardCounter::kUpdatesApplied);
    if (o.compensated) Add(ShardCounter::kCompensated);
    if (o.uncompensated) Add(ShardCounter::kUncompensated);
    if (o.dropped) {
      Add(bsp ? ShardCounter::kDroppedLate : ShardCounter::kDroppedStale);
    }
    if (o.step_applied) {
      Add(ShardCounter::kStepsApplied);
      if (o.step_short) Add(ShardCounter::kStepsShort);
      Bump(staleness_[0]);  // A bsp step is computed from the current weights.
    }
    if (!bsp) {
      const int64_t s = std::max<int64_t>(0, o.staleness);
      Bump(staleness_[std::min<int64_t>(s, kStalenessBuckets - 1)]);
    }
  }

  ShardCounters Snapshot() const {
    ShardCounters c;
    for (size_t k = 0; k < counters_.size(); ++k) {
      c.values[k] = Get(counters_[k]);
    }
    for (const auto& b : staleness_) c.staleness_histogram.push_back(Get(b));
    return c;
  }

 private:
  static void Bump(std::atomic<int64_t>& n) {
    n.fetch_add(1, std::memory_order_relaxed);
  }
  static int64_t Get(const std::atomic<int64_t>& n) {
    return n.load(std::memory_order_relaxed);
  }

  std::array<std::atomic<int64_t>, kNumShardCounters> counters_{};
  std::vector<std::atomic<int64_t>> staleness_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_COUNTERS_H_
