// ParameterServerService's sparse rows: DeclareEmbedding, PullRows and
// PushRows over gRPC, into the shard's EmbeddingTables.
#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"
#include "server/rows.h"
#include "server/service.h"

namespace asyncps {

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
  if (!Allowed(ServePullRows(tables_, store_->shard(), num_shards_, *request,
                             response),
               reactor)) {
    return reactor;
  }
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
  if (!Allowed(ServePushRows(tables_, store_->shard(), num_shards_, *request,
                             response),
               reactor)) {
    return reactor;
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::ReadRows(
    grpc::CallbackServerContext* context, const v1::ReadRowsRequest* request,
    v1::ReadRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(), 0,
                                      /*anyone=*/true),
               reactor)) {
    return reactor;
  }
  if (!Allowed(ServeReadRows(tables_, *request, response), reactor)) {
    return reactor;
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace asyncps
