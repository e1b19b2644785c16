// ParameterServerService's sparse rows: DeclareEmbedding, PullRows and
// PushRows over gRPC, into the shard's EmbeddingTables.
#include <cstring>

#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"
#include "server/service.h"

namespace asyncps {
namespace {

// The ids a request carries (little-endian int64), each of them one that
// RowShard gives this shard. INVALID_ARGUMENT naming what is wrong.
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
  std::memcpy(ids.data(), bytes.data(), bytes.size());
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

grpc::ServerUnaryReactor* ParameterServerService::DeclareEmbedding(
    grpc::CallbackServerContext* context,
    const v1::DeclareEmbeddingRequest* request,
    v1::DeclareEmbeddingResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  // Only the job's workers make tables (each costs the shard memory);
  // declaring one that is there, as it is, is open to the job (a reader
  // learns the table's width so).
  if (!Allowed(tables_->Declare(request->spec(),
                                membership_->Authorize(request->rank(),
                                                       request->secret(), 0)),
               reactor)) {
    return reactor;
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PullRows(
    grpc::CallbackServerContext* context, const v1::PullRowsRequest* request,
    v1::PullRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(), 0,
                                      /*anyone=*/true),
               reactor)) {
    return reactor;
  }
  absl::StatusOr<EmbeddingTable*> table = tables_->Find(request->table());
  absl::StatusOr<std::vector<int64_t>> ids =
      Ids(request->ids(), store_->shard(), num_shards_);
  if (!Allowed(table.status(), reactor) || !Allowed(ids.status(), reactor)) {
    return reactor;
  }
  std::vector<float> rows(ids->size() *
                          static_cast<size_t>((*table)->spec().dim()));
  if (!Allowed((*table)->Pull(*ids, absl::MakeSpan(rows)), reactor)) {
    return reactor;
  }
  response->set_rows(reinterpret_cast<const char*>(rows.data()),
                     rows.size() * sizeof(float));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PushRows(
    grpc::CallbackServerContext* context, const v1::PushRowsRequest* request,
    v1::PushRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(), 0),
               reactor)) {
    return reactor;
  }
  absl::StatusOr<EmbeddingTable*> table = tables_->Find(request->table());
  absl::StatusOr<std::vector<int64_t>> ids =
      Ids(request->ids(), store_->shard(), num_shards_);
  if (!Allowed(table.status(), reactor) || !Allowed(ids.status(), reactor)) {
    return reactor;
  }
  const std::string& bytes = request->grads();
  if (bytes.size() % sizeof(float) != 0) {
    Allowed(absl::InvalidArgumentError(
                absl::StrCat("gradients of ", bytes.size(),
                             " bytes: not a whole number of f32s")),
            reactor);
    return reactor;
  }
  std::vector<float> grads(bytes.size() / sizeof(float));
  std::memcpy(grads.data(), bytes.data(), bytes.size());
  if (!Allowed((*table)->Push(*ids, grads), reactor)) return reactor;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace asyncps
