#include "server/edge/service.h"

#include <chrono>
#include <utility>

#include "absl/time/time.h"
#include "common/security.h"
#include "common/status.h"
#include "rpc/grpc_status.h"

namespace asyncps {

ParameterServerService::ParameterServerService(
    ShardStore* store, Membership* membership, Consistency* consistency,
    KvStore* kv, Clock* clock, int num_shards, Checkpointer* checkpointer,
    EmbeddingTables* tables, v1::DataPlaneResponse data_plane,
    std::string token, std::string admin_token)
    : store_(store),
      membership_(membership),
      consistency_(consistency),
      kv_(kv),
      checkpointer_(checkpointer),
      tables_(tables),
      clock_(clock),
      num_shards_(num_shards),
      start_(clock->Now()),
      data_plane_(std::move(data_plane)),
      token_(std::move(token)),
      admin_token_(std::move(admin_token)) {}

namespace {

absl::Time Deadline(const grpc::CallbackServerContext* context) {
  const auto deadline = context->deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(deadline);
}

// The call's metadata value under `key` ("" when it has none: no secret
// is empty, so "" never matches one).
absl::string_view Metadata(const grpc::CallbackServerContext* context,
                           const char* key) {
  const auto& metadata = context->client_metadata();
  const auto it = metadata.find(key);
  if (it == metadata.end()) return "";
  return absl::string_view(it->second.data(), it->second.size());
}

}  // namespace

bool ParameterServerService::Admit(grpc::CallbackServerContext* context,
                                   grpc::ServerUnaryReactor* reactor) {
  if (!token_.empty()) {
    if (!TokenMatches(token_, Metadata(context, kAuthorizationKey))) {
      // Never says what was expected, nor echoes what came.
      reactor->Finish(grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                   "missing or wrong auth token (see "
                                   "--auth_token_file)"));
      return false;
    }
  }
  if (Deadline(context) < clock_->Now()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                 "deadline passed before the server began"));
    return false;
  }
  return true;
}

absl::Status ParameterServerService::MayAdminister(
    const grpc::CallbackServerContext* context) const {
  if (admin_token_.empty()) {
    if (token_.empty()) return absl::OkStatus();  // A trusted local run.
    return absl::PermissionDeniedError(
        "this shard runs with --auth_token_file but no --admin_token_file: "
        "Checkpoint is refused (the workers' token does not allow it)");
  }
  if (!ConstantTimeEquals(admin_token_, Metadata(context, kAdminTokenKey))) {
    return absl::PermissionDeniedError(
        "Checkpoint needs the admin token (psctl --admin_token_file)");
  }
  return absl::OkStatus();
}

bool ParameterServerService::Allowed(const absl::Status& s,
                                     grpc::ServerUnaryReactor* reactor) {
  if (s.ok()) return true;
  store_->CountRejected();
  reactor->Finish(ToGrpcStatus(s));
  return false;
}

absl::Status ParameterServerService::MayDeclare(
    const v1::DeclareModelRequest& request) {
  if (store_->Spec().ok()) return absl::OkStatus();
  if (request.rank() < 0) {
    return absl::PermissionDeniedError(absl::StrCat(
        "only a registered worker of the job declares the model; this call "
        "names rank ",
        request.rank(), " (other clients wait for it: GetModel)"));
  }
  return membership_->Authorize(request.rank(), request.secret(), 0);
}

ShardParts ParameterServerService::Parts() const {
  ShardParts parts;
  parts.store = store_;
  parts.membership = membership_;
  parts.consistency = consistency_;
  parts.clock = clock_;
  parts.checkpointer = checkpointer_;
  parts.tables = tables_;
  parts.num_shards = num_shards_;
  parts.start = start_;
  return parts;
}

PendingCall ParameterServerService::Pending(
    grpc::CallbackServerContext* context, grpc::ServerUnaryReactor* reactor) {
  PendingCall call;
  call.deadline = Deadline(context);
  call.cancelled = [context] { return context->IsCancelled(); };
  call.done = [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); };
  return call;
}

grpc::ServerUnaryReactor* ParameterServerService::DeclareModel(
    grpc::CallbackServerContext* context,
    const v1::DeclareModelRequest* request,
    v1::DeclareModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(MayDeclare(*request), reactor)) return reactor;
  auto result = consistency_->Declare(*request);
  if (result.ok()) *response = *std::move(result);
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Pull(
    grpc::CallbackServerContext* context, const v1::PullRequest* request,
    v1::PullResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(),
                                      request->clock(), /*anyone=*/true),
               reactor)) {
    return reactor;
  }
  consistency_->Pull(*request, response, Pending(context, reactor));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Push(
    grpc::CallbackServerContext* context, const v1::PushRequest* request,
    v1::PushResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(),
                                      request->clock()),
               reactor)) {
    return reactor;
  }
  reactor->Finish(ToGrpcStatus(consistency_->Push(*request, response)));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::PushPull(
    grpc::CallbackServerContext* context, const v1::PushPullRequest* request,
    v1::PushPullResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  const v1::PushRequest& push = request->push();
  if (!Allowed(membership_->Authorize(push.rank(), push.secret(), push.clock()),
               reactor)) {
    return reactor;
  }
  consistency_->PushPull(*request, response, Pending(context, reactor));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::GetModel(
    grpc::CallbackServerContext* context, const v1::GetModelRequest* request,
    v1::GetModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  auto spec = store_->Spec();
  if (spec.ok()) {
    *response->mutable_spec() = *std::move(spec);
    response->set_newest_version(store_->Progress(/*bsp=*/false).second);
  }
  reactor->Finish(ToGrpcStatus(spec.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::DataPlane(
    grpc::CallbackServerContext* context, const v1::DataPlaneRequest* request,
    v1::DataPlaneResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  *response = data_plane_;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Register(
    grpc::CallbackServerContext* context, const v1::RegisterRequest* request,
    v1::RegisterResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(consistency_->ReplicaServing(), reactor)) return reactor;
  auto result = consistency_->Register(*request);
  if (result.ok()) {
    *response = *std::move(result);
    response->set_mode(ModeName(consistency_->config().mode));
    response->set_shard_incarnation(store_->incarnation());
  } else {
    store_->CountRejected();
  }
  reactor->Finish(ToGrpcStatus(result.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Heartbeat(
    grpc::CallbackServerContext* context, const v1::HeartbeatRequest* request,
    v1::HeartbeatResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(consistency_->ReplicaServing(), reactor)) return reactor;
  absl::Status s = consistency_->Heartbeat(*request, response);
  if (!s.ok()) store_->CountRejected();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Assign(
    grpc::CallbackServerContext* context, const v1::AssignRequest* request,
    v1::AssignResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(), 0),
               reactor)) {
    return reactor;
  }
  reactor->Finish(ToGrpcStatus(consistency_->Assign(*request)));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::StoreSet(
    grpc::CallbackServerContext* context, const v1::StoreSetRequest* request,
    v1::StoreSetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  // Only the job's workers write the rendezvous (rings meet through it).
  if (!Allowed(membership_->Authorize(request->rank(), request->secret(), 0),
               reactor)) {
    return reactor;
  }
  absl::Status s = kv_->Set(request->key(), request->value());
  if (!s.ok()) store_->CountRejected();
  reactor->Finish(ToGrpcStatus(s));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::StoreGet(
    grpc::CallbackServerContext* context, const v1::StoreGetRequest* request,
    v1::StoreGetResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  kv_->Get(request->key(), absl::Milliseconds(request->wait_ms()),
           response->mutable_value(), Pending(context, reactor));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Checkpoint(
    grpc::CallbackServerContext* context, const v1::CheckpointRequest* request,
    v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  if (!Allowed(MayAdminister(context), reactor)) return reactor;
  if (request->lease_ms() < 0 ||
      absl::Milliseconds(request->lease_ms()) > kMaxPauseLease) {
    reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
        "lease_ms ", request->lease_ms(), " is outside [0, ",
        absl::ToInt64Milliseconds(kMaxPauseLease), "] (0: one minute)"))));
    return reactor;
  }
  if (checkpointer_ == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                 "this server runs without --checkpoint_dir"));
    return reactor;
  }
  absl::StatusOr<std::string> path;
  switch (request->phase()) {
    case v1::CheckpointRequest::PAUSE: {
      const int64_t lease_ms =
          request->lease_ms() > 0 ? request->lease_ms() : 60000;
      consistency_->Pause(request->until_step(), absl::Milliseconds(lease_ms));
      const auto [lo, hi] =
          store_->Progress(consistency_->config().mode == Mode::kBsp);
      response->set_min_step(lo);
      response->set_max_step(hi);
      path = "";
      break;
    }
    case v1::CheckpointRequest::RESUME:
      consistency_->Resume();
      path = "";
      break;
    case v1::CheckpointRequest::WRITE:
      path = checkpointer_->WriteJob(request->tag());
      break;
    default:
      path = checkpointer_->Write();
  }
  if (path.ok()) response->set_path(*path);
  reactor->Finish(ToGrpcStatus(path.status()));
  return reactor;
}

grpc::ServerUnaryReactor* ParameterServerService::Stats(
    grpc::CallbackServerContext* context, const v1::StatsRequest* request,
    v1::StatsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (!Admit(context, reactor)) return reactor;
  *response = CollectStats(Parts());
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace asyncps
