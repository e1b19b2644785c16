// The sparse-row calls as a shard serves them, whichever transport brought
// them (gRPC: service_rows.cc; the data plane: data_plane.cc), after the
// caller was authorized and Consistency (server/consistency_rows.cc) let
// them go: the ids checked to be this shard's own (RowShard), the table
// found, the rows pulled or the gradients applied. Errors name
// what was wrong (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED) and
// change no row.
#ifndef ASYNCPS_SERVER_ROWS_H_
#define ASYNCPS_SERVER_ROWS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"
#include "server/embedding_table.h"
#include "server/shard_store.h"

namespace asyncps {

// A pull of rows resolved: its table (valid as long as the tables) and
// ids, checked to be this shard's and inside a bounded table. What a held
// pull keeps until it is answered.
struct RowPull {
  EmbeddingTable* table = nullptr;
  std::vector<int64_t> ids;
};
absl::StatusOr<RowPull> ResolvePullRows(EmbeddingTables* tables, int shard,
                                        int num_shards,
                                        const std::string& table,
                                        const std::string& ids);
// The rows of `pull` into `rows` (f32 bytes, in the ids' order).
absl::Status FinishPullRows(const RowPull& pull, std::string* rows);

// Resolve, then Finish, into response->rows.
absl::Status ServePullRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PullRowsRequest& request,
                           v1::PullRowsResponse* response);

// How a push of rows is applied: on arrival (async, ssp), or added to the
// table's step request.clock() as request.rank()'s, applied once `quorum`
// ranks pushed it (bsp).
struct RowPolicy {
  bool bsp = false;
  int quorum = 1;
  absl::Time now;
};
// Applies the push once per (client_id, sequence) (tables->ledger(): a
// retry gets the first answer and changes nothing). Its pull_ids are not
// read here (Consistency::PushRows pulls them). `*applied` (if given) is
// set true only if this call changed the table (a replicated shard streams
// just those: not a retry answered, nor a push refused).
absl::Status ServePushRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PushRowsRequest& request,
                           v1::PushRowsResponse* response,
                           const RowPolicy& policy = {},
                           bool* applied = nullptr);

// bsp housekeeping of a shard: its slices' steps (ShardStore::AdvanceSteps)
// and its tables' (EmbeddingTables::AdvanceSteps; `tables` may be null),
// as one result (a table's step applied counts as completed).
ShardStore::StepsAdvanced AdvanceShardSteps(
    ShardStore* store, EmbeddingTables* tables,
    const ShardStore::StepAdvance& advance);

// A page of the table's rows (ReadRowsRequest); INVALID_ARGUMENT for a
// start below 0 or max_rows outside [1, 65536].
absl::Status ServeReadRows(EmbeddingTables* tables,
                           const v1::ReadRowsRequest& request,
                           v1::ReadRowsResponse* response);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_ROWS_H_
