// ParameterServerService's sparse rows: DeclareEmbedding, PullRows,
// PushRows and ReadRows over gRPC, into the shard's EmbeddingTables (pulls
// and pushes through Consistency, which may hold a pull).
#include "absl/strings/str_cat.h"
#include "rpc/grpc_status.h"
#include "server/edge/service.h"
#include "server/rows.h"

namespace asyncps {

grpc::ServerUnaryReactor* ParameterServerService::RowCall(
    grpc::CallbackServerContext* context,
    const std::function<absl::Status()>& authorize,
    const std::function<absl::Status()>& serve) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (Admit(context, reactor) && Allowed(authorize(), reactor) &&
      Allowed(serve(), reactor)) {
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::DeclareEmbedding(
    grpc::CallbackServerContext* context,
    const v1::DeclareEmbeddingRequest* request,
    v1::DeclareEmbeddingResponse* response) {
  // Only the job's workers make tables (each costs the shard memory);
  // declaring one that is there, as it is, is open to the job (a reader
  // learns the table's width so): Declare judges with the authorization.
  return RowCall(
      context, [] { return absl::OkStatus(); },
      [&] {
        return consistency_->DeclareEmbedding(
            request->spec(),
            membership_->Authorize(request->rank(), request->secret(), 0));
      });
}

grpc::ServerUnaryReactor* ParameterServerService::PullRows(
    grpc::CallbackServerContext* context, const v1::PullRowsRequest* request,
    v1::PullRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (Admit(context, reactor) &&
      Allowed(membership_->Authorize(request->rank(), request->secret(),
                                     request->clock(), /*anyone=*/true),
              reactor)) {
    consistency_->PullRows(*request, response, Pending(context, reactor));
  }
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PushRows(
    grpc::CallbackServerContext* context, const v1::PushRowsRequest* request,
    v1::PushRowsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (Admit(context, reactor) &&
      Allowed(membership_->Authorize(request->rank(), request->secret(),
                                     request->clock()),
              reactor)) {
    consistency_->PushRows(*request, response, Pending(context, reactor));
  }
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::ReadRows(
    grpc::CallbackServerContext* context, const v1::ReadRowsRequest* request,
    v1::ReadRowsResponse* response) {
  return RowCall(
      context,
      [&] {
        return membership_->Authorize(request->rank(), request->secret(), 0,
                                      /*anyone=*/true);
      },
      [&] { return consistency_->ReadRows(*request, response); });
}

}  // namespace asyncps
