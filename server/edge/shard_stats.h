// What a shard reports about itself: the Stats RPC's answer, and the source
// of its Prometheus metrics (server/edge/metrics.h), assembled in one place.
#ifndef ASYNCPS_SERVER_EDGE_SHARD_STATS_H_
#define ASYNCPS_SERVER_EDGE_SHARD_STATS_H_

#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/asyncps.pb.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/embedding_table.h"
#include "server/membership.h"
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

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_SHARD_STATS_H_
