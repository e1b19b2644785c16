// The sparse-row calls as a shard serves them, whichever transport brought
// them (gRPC: service_rows.cc; the data plane: data_plane.cc), after the
// caller was authorized: the ids checked to be this shard's own (RowShard),
// the table found, the rows pulled or the gradients applied. Errors name
// what was wrong (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED) and
// change no row.
#ifndef ASYNCPS_SERVER_ROWS_H_
#define ASYNCPS_SERVER_ROWS_H_

#include "absl/status/status.h"
#include "proto/asyncps.pb.h"
#include "server/embedding_table.h"

namespace asyncps {

absl::Status ServePullRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PullRowsRequest& request,
                           v1::PullRowsResponse* response);
// Pushes once per (client_id, sequence) (tables->ledger(): a retry gets
// the first answer), then pulls request.pull_ids into response->rows.
absl::Status ServePushRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PushRowsRequest& request,
                           v1::PushRowsResponse* response);

// A page of the table's rows (ReadRowsRequest); INVALID_ARGUMENT for a
// start below 0 or max_rows outside [1, 65536].
absl::Status ServeReadRows(EmbeddingTables* tables,
                           const v1::ReadRowsRequest& request,
                           v1::ReadRowsResponse* response);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_ROWS_H_
