#include "server/rows.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {
namespace {

// The ids a request carries (little-endian int64), each of them one that
// RowShard gives this shard.
absl::StatusOr<std::vector<int64_t>> Ids(const std::string& bytes, int shard,
                                         int num_shards) {
  if (bytes.size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids of ", bytes.size(), " bytes: not a whole number of int64s"));
  }
  if (bytes.size() / sizeof(int64_t) > kMaxRowsPerCall) {
    return absl::ResourceExhaustedError(
        absl::StrCat(bytes.size() / sizeof(int64_t),
                     " ids in one call; at most ", kMaxRowsPerCall));
  }
  std::vector<int64_t> ids(bytes.size() / sizeof(int64_t));
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), bytes.size());
  for (int64_t id : ids) {
    if (RowShard(id, num_shards) != shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          "id ", id, " belongs to shard ", RowShard(id, num_shards), ", not ",
          shard, " (RowShard)"));
    }
  }
  return ids;
}

}  // namespace

absl::Status ServePullRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PullRowsRequest& request,
                           v1::PullRowsResponse* response) {
  ASSIGN_OR_RETURN(EmbeddingTable * table, tables->Find(request.table()));
  ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                   Ids(request.ids(), shard, num_shards));
  std::vector<float> rows(ids.size() *
                          static_cast<size_t>(table->spec().dim()));
  RETURN_IF_ERROR(table->Pull(ids, absl::MakeSpan(rows)));
  response->set_rows(reinterpret_cast<const char*>(rows.data()),
                     rows.size() * sizeof(float));
  return absl::OkStatus();
}

absl::Status ServePushRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PushRowsRequest& request) {
  ASSIGN_OR_RETURN(EmbeddingTable * table, tables->Find(request.table()));
  ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                   Ids(request.ids(), shard, num_shards));
  const std::string& bytes = request.grads();
  if (bytes.size() % sizeof(float) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradients of ", bytes.size(), " bytes: not a whole number of f32s"));
  }
  std::vector<float> grads(bytes.size() / sizeof(float));
  if (!grads.empty()) std::memcpy(grads.data(), bytes.data(), bytes.size());
  return table->Push(ids, grads);
}

}  // namespace asyncps
