// What a shard reports about itself: the Stats RPC's answer, and the source
// of its Prometheus metrics (server/edge/metrics.h), assembled in one place.
#ifndef ASYNCPS_SERVER_EDGE_SHARD_STATS_H_
#define ASYNCPS_SERVER_EDGE_SHARD_STATS_H_

#include <cstdint>

#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/clock.h"
#include "proto/asyncps.pb.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/embedding_table.h"
#include "server/membership.h"
#include "server/shard_counters.h"
#include "server/shard_store.h"

namespace asyncps {

// The parts a shard's report reads; borrowed.
struct ShardParts {
  ShardStore* store = nullptr;
  Membership* membership = nullptr;
  Consistency* consistency = nullptr;
  Clock* clock = nullptr;
  const Checkpointer* checkpointer = nullptr;  // Null: no checkpoints.
  const EmbeddingTables* tables = nullptr;     // Null: none.
  int num_shards = 1;
  absl::Time start;  // When the shard started (uptime).
};

// The shard's counters, workers and mode counters now.
v1::StatsResponse CollectStats(const ShardParts& parts);

// The scalar metrics of a Stats answer, in one table: each row names one
// Prometheus sample and where its value lives. A shard counter
// (ShardCounter, server/shard_counters.h) is one row: its metric, help text
// and Stats field; CollectStats copies every counter row into the answer and
// StatsToMetrics (server/edge/metrics.h) writes every row. So a new counter
// is its ShardCounter, its row and its proto field; the build fails if a
// counter has no row, or two.

// A metric's Prometheus type (kept apart from prometheus-cpp's enum so that
// the Stats answer does not depend on the metrics library).
enum class StatKind { kCounter, kGauge };

// Where a row's sample goes in StatsToMetrics' output: between the sections
// are the families written by hand (the staleness histogram, per-worker
// series, the replica's role, the shard's info, the embedding tables).
enum class StatSection {
  kCalls,    // Calls and slice updates, first.
  kWorkers,  // Worker counts, before the per-worker series.
  kShard,    // The shard's state and checkpoints.
  kReplica,  // Only for a replicated shard (Stats has `replica`).
  kSsp,      // Only in ssp mode.
};

struct StatRow {
  StatSection section;
  const char* name;  // Consecutive rows of one name are one family's samples.
  const char* help;
  StatKind kind;
  // The sample's one label, or none (nullptr).
  const char* label_name = nullptr;
  const char* label_value = nullptr;
  // A counter row: the counter, and its Stats field, which CollectStats
  // sets with `set` and the metric reads back with `get`.
  ShardCounter counter = ShardCounter::kCount;
  void (v1::StatsResponse::*set)(int64_t) = nullptr;
  int64_t (v1::StatsResponse::*get)() const = nullptr;
  // Any other row: the value, read from the answer.
  double (*read)(const v1::StatsResponse&) = nullptr;

  constexpr bool counted() const { return set != nullptr; }
  // The value of this row's sample in `stats`.
  double Value(const v1::StatsResponse& stats) const {
    return counted() ? static_cast<double>((stats.*get)()) : read(stats);
  }
};

// Every row, in output order within each section.
absl::Span<const StatRow> StatRows();

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_SHARD_STATS_H_
