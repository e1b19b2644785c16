// EmbeddingClient: sparse embedding tables on the shards (docs/SPARSE.md):
// declare a table on every shard, pull the rows of a batch's ids and push
// their gradients. Each id goes to the shard RowShard names; a call to
// several shards goes out at once, through a ShardCaller (client/
// shard_caller.h: deadlines, retries, the rank's secret), over the
// client's transport (the data plane, or gRPC).
// A push is checked whole here (ids of a bounded table, finite gradients)
// before any shard gets its part, so a bad push changes no row on any
// shard; a shard that fails mid-call can still leave the others' parts
// applied, as for dense pushes. Pushes of rows are not exactly-once yet: a
// push retried after its answer was lost may apply twice. Thread-safe.
#ifndef ASYNCPS_CLIENT_EMBEDDING_CLIENT_H_
#define ASYNCPS_CLIENT_EMBEDDING_CLIENT_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/shard_caller.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

class EmbeddingClient {
 public:
  // `caller` is borrowed and must outlive this client.
  explicit EmbeddingClient(ShardCaller* caller) : caller_(caller) {}

  // Declares `spec` on every shard (idempotent). Making a table is a
  // registered worker's call (PERMISSION_DENIED for others); anyone in the
  // job may declare one that is there, as it is, before pulling its rows.
  // The shards' errors: INVALID_ARGUMENT for a bad spec,
  // FAILED_PRECONDITION for another spec under the name.
  absl::Status Declare(const v1::EmbeddingSpec& spec);

  // The rows of `ids` into `rows` (ids.size() x dim, in the ids' order; a
  // repeated id is asked for once). NOT_FOUND for a table this client has
  // not declared; the shards' errors otherwise (an id outside a bounded
  // table, too many ids: nothing changes).
  absl::Status PullRows(const std::string& table, absl::Span<const int64_t> ids,
                        absl::Span<float> rows);
  // Pushes `grads` (ids.size() x dim, row k for ids[k]; a repeated id's
  // rows are summed on its shard). Errors as for PullRows, and a NaN or
  // infinite gradient refused with nothing changed.
  absl::Status PushRows(const std::string& table, absl::Span<const int64_t> ids,
                        absl::Span<const float> grads);

 private:
  // The table's spec, from Declare.
  absl::StatusOr<v1::EmbeddingSpec> Spec(const std::string& table) const;

  ShardCaller* const caller_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, v1::EmbeddingSpec> specs_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_EMBEDDING_CLIENT_H_
