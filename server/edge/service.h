// ParameterServerService: the gRPC face of one shard (callback API). gRPC
// stays out of the shard core (server/): it is known here at the edge (this
// service, the interceptors, the RPC metrics), by the composition that
// builds the gRPC server (shard_server, ps_server_main) and by the replica
// member and etcd coordinator (server/replica/). Each handler checks its
// deadline the same way (Admit), hands the request to the ShardStore,
// Membership, Consistency or KvStore, and answers the status they give; calls
// that wait go to them as PendingCalls. Calls acting as a rank are authorized
// by Membership (the rank's registration secret) before anything is applied.
// Thread-safe.
#ifndef ASYNCPS_SERVER_EDGE_SERVICE_H_
#define ASYNCPS_SERVER_EDGE_SERVICE_H_

#include <functional>

#include "common/clock.h"
#include "proto/asyncps.grpc.pb.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/edge/shard_stats.h"
#include "server/embedding_table.h"
#include "server/held_calls.h"
#include "server/kv_store.h"
#include "server/membership.h"
#include "server/shard_store.h"

namespace asyncps {

class ParameterServerService final
    : public v1::ParameterServer::CallbackService {
 public:
  // Every pointer is borrowed and must outlive this. `data_plane` is what
  // the DataPlane RPC answers (port 0: none). With a `token`, every call
  // must carry it (authorization: Bearer <token>) or is UNAUTHENTICATED
  // before anything is read. Checkpoint needs `admin_token` (metadata
  // kAdminTokenKey); with a `token` but no `admin_token` it is refused, and
  // with neither (a trusted local run) it is open.
  ParameterServerService(ShardStore* store, Membership* membership,
                         Consistency* consistency, KvStore* kv, Clock* clock,
                         int num_shards, Checkpointer* checkpointer,
                         EmbeddingTables* tables,
                         v1::DataPlaneResponse data_plane,
                         std::string token = "", std::string admin_token = "");

  grpc::ServerUnaryReactor* DeclareModel(
      grpc::CallbackServerContext* context,
      const v1::DeclareModelRequest* request,
      v1::DeclareModelResponse* response) override;
  grpc::ServerUnaryReactor* Pull(grpc::CallbackServerContext* context,
                                 const v1::PullRequest* request,
                                 v1::PullResponse* response) override;
  grpc::ServerUnaryReactor* Push(grpc::CallbackServerContext* context,
                                 const v1::PushRequest* request,
                                 v1::PushResponse* response) override;
  grpc::ServerUnaryReactor* PushPull(grpc::CallbackServerContext* context,
                                     const v1::PushPullRequest* request,
                                     v1::PushPullResponse* response) override;
  grpc::ServerUnaryReactor* GetModel(grpc::CallbackServerContext* context,
                                     const v1::GetModelRequest* request,
                                     v1::GetModelResponse* response) override;
  grpc::ServerUnaryReactor* DataPlane(grpc::CallbackServerContext* context,
                                      const v1::DataPlaneRequest* request,
                                      v1::DataPlaneResponse* response) override;
  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* context,
                                     const v1::RegisterRequest* request,
                                     v1::RegisterResponse* response) override;
  // Sparse rows (service_rows.cc).
  grpc::ServerUnaryReactor* DeclareEmbedding(
      grpc::CallbackServerContext* context,
      const v1::DeclareEmbeddingRequest* request,
      v1::DeclareEmbeddingResponse* response) override;
  grpc::ServerUnaryReactor* PullRows(grpc::CallbackServerContext* context,
                                     const v1::PullRowsRequest* request,
                                     v1::PullRowsResponse* response) override;
  grpc::ServerUnaryReactor* PushRows(grpc::CallbackServerContext* context,
                                     const v1::PushRowsRequest* request,
                                     v1::PushRowsResponse* response) override;
  grpc::ServerUnaryReactor* ReadRows(grpc::CallbackServerContext* context,
                                     const v1::ReadRowsRequest* request,
                                     v1::ReadRowsResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* Assign(grpc::CallbackServerContext* context,
                                   const v1::AssignRequest* request,
                                   v1::AssignResponse* response) override;
  grpc::ServerUnaryReactor* StoreSet(grpc::CallbackServerContext* context,
                                     const v1::StoreSetRequest* request,
                                     v1::StoreSetResponse* response) override;
  grpc::ServerUnaryReactor* StoreGet(grpc::CallbackServerContext* context,
                                     const v1::StoreGetRequest* request,
                                     v1::StoreGetResponse* response) override;
  grpc::ServerUnaryReactor* Checkpoint(
      grpc::CallbackServerContext* context,
      const v1::CheckpointRequest* request,
      v1::CheckpointResponse* response) override;
  grpc::ServerUnaryReactor* Stats(grpc::CallbackServerContext* context,
                                  const v1::StatsRequest* request,
                                  v1::StatsResponse* response) override;

  // What the shard's report reads (the Stats answer, /metrics).
  ShardParts Parts() const;

 private:
  // Finishes the call through `reactor` (the context's default one, which
  // may be asked for once only) with UNAUTHENTICATED if it lacks the
  // token, or with DEADLINE_EXCEEDED if its deadline has passed, and
  // returns false; otherwise returns true. Every handler starts here.
  bool Admit(grpc::CallbackServerContext* context,
             grpc::ServerUnaryReactor* reactor);
  // Finishes the call with `s`, counted as rejected, and returns false
  // unless `s` is OK (an authorization check's answer).
  bool Allowed(const absl::Status& s, grpc::ServerUnaryReactor* reactor);
  // A row call (service_rows.cc): admitted, authorized, served, answered;
  // the first failure is the answer.
  grpc::ServerUnaryReactor* RowCall(
      grpc::CallbackServerContext* context,
      const std::function<absl::Status()>& authorize,
      const std::function<absl::Status()>& serve);
  // PERMISSION_DENIED unless the call carries the admin token (see the
  // constructor).
  absl::Status MayAdminister(const grpc::CallbackServerContext* context) const;
  // Whether this declare may go on: one that would create the model must
  // come from a registered worker of the job, with its registration's
  // secret (any rank: workers start in any order, and a squatter could as
  // well register as rank 0); one of a model already there creates nothing
  // and is left to the store to check.
  absl::Status MayDeclare(const v1::DeclareModelRequest& request);
  // The call as core classes see it: its deadline, whether it was
  // cancelled, and how to answer it through `reactor`.
  static PendingCall Pending(grpc::CallbackServerContext* context,
                             grpc::ServerUnaryReactor* reactor);

  ShardStore* const store_;
  Membership* const membership_;
  Consistency* const consistency_;
  KvStore* const kv_;
  Checkpointer* const checkpointer_;  // Null without --checkpoint_dir.
  EmbeddingTables* const tables_;
  Clock* const clock_;
  const int num_shards_;
  const absl::Time start_;
  const v1::DataPlaneResponse data_plane_;
  const std::string token_;
  const std::string admin_token_;
};

// The longest a Checkpoint PAUSE may hold a shard's pushes: a longer lease
// is refused (INVALID_ARGUMENT), so no caller can stop the job at length.
inline constexpr absl::Duration kMaxPauseLease = absl::Minutes(5);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_SERVICE_H_
