// ShardServer: one running shard of the parameter server, in-process. It
// owns every part of the shard (ShardStore, Membership, Consistency, the
// rendezvous KvStore, the Checkpointer, the gRPC service and server) and
// the housekeeping thread that ticks them; restores the newest valid
// checkpoint at Start and writes a last one at Shutdown. ps_server's main
// is flags and signals around one of these; tests start one directly.
// Thread-safe.
#ifndef ASYNCPS_SERVER_SHARD_SERVER_H_
#define ASYNCPS_SERVER_SHARD_SERVER_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "common/metrics_endpoint.h"
#include "common/security.h"
#include "common/timeline.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/edge/call_interceptor.h"
#include "server/edge/call_timeline.h"
#include "server/edge/data_plane.h"
#include "server/edge/metrics.h"
#include "server/edge/rpc_metrics.h"
#include "server/edge/service.h"
#include "server/embedding_table.h"
#include "server/kv_store.h"
#include "server/membership.h"
#include "server/replication.h"
#include "server/shard_store.h"

namespace asyncps {

// Bytes reserved in each response for keys and framing.
inline constexpr int64_t kResponseOverhead = 64 << 10;

struct ShardServerConfig {
  std::string host = "0.0.0.0";  // "" serves in-process only.
  int port = 0;                  // 0: the kernel picks one.
  // The data plane's port (server/edge/data_plane.h): 0, the kernel picks one;
  // -1, none (clients use gRPC for tensors too). Off whenever host is "".
  int data_port = 0;
  int max_data_connections = 1024;
  int max_data_connections_per_client = 256;  // Per client address.
  // gRPC calls in flight on one connection (HTTP/2 max concurrent streams).
  int max_streams_per_connection = 256;
  // The job's worker count, fixed (Membership's job_workers); 0: learned
  // from the workers.
  int num_workers = 0;
  // Workers join and leave while the job trains (Membership's elastic;
  // docs/ELASTIC.md); num_workers is then how many a bsp start waits for.
  bool elastic = false;
  // After a start, how long ranks that have not registered (again) may
  // pull and push: a restarted shard's workers go on while their
  // heartbeats register them (Membership's rejoin_grace).
  absl::Duration rejoin_grace = absl::ZeroDuration();
  // Prometheus' /metrics on this port (0: none); off whenever host is "".
  int metrics_port = 0;
  int shard = 0;
  int num_shards = 1;
  int64_t max_message_bytes = 64 << 20;
  int64_t max_shard_bytes = int64_t{4} << 30;
  std::string checkpoint_dir;  // Empty: no checkpoints.
  // Restore job checkpoint <tag> (psctl checkpoint --tag) instead of the
  // newest periodic one; empty: the newest.
  std::string restore_job;
  absl::Duration checkpoint_every = absl::Seconds(60);
  int checkpoint_keep = 3;
  absl::Duration worker_timeout = absl::Seconds(10);
  ConsistencyConfig consistency;
  absl::Duration shutdown_grace = absl::Seconds(5);
  // Period of housekeeping: held-call deadlines, bsp step deadlines,
  // liveness logs; and of the periodic-checkpoint thread.
  absl::Duration tick = absl::Milliseconds(20);
  // Chrome trace-event file of what the shard serves (common/timeline.h);
  // empty: none.
  std::string timeline;
  // TLS (mutual with a CA) and the bearer token every call must carry;
  // the data plane takes the same certificate, key and CA.
  Security security;
  // Stamped on every slice answered (ShardStore's incarnation); 0: a
  // random one. A replicated shard's members share their group's.
  uint64_t incarnation = 0;
  // A member of a replicated shard group (ps_server --replicas; driven by
  // ReplicaMember): `member` is its address as the group lists it
  // (DefaultMember if empty). It
  // serves no worker until it is made the primary, restores no checkpoint
  // at start (it copies its primary's state) and needs a data plane.
  bool replicated = false;
  std::string member;
  // How long a backup may take to acknowledge a change before the primary
  // drops it from the group.
  absl::Duration replica_ack_timeout = absl::Seconds(5);
  // The fewest members, the primary included, that hold a change before it
  // is acknowledged (Replication::set_min_insync); ps_server's
  // --min_insync defaults to 2 in a group of 2 or more.
  int min_insync = 1;
  // How far a joining backup may fall behind, in bytes of ops
  // (Replication::set_join_backlog_bytes).
  int64_t join_backlog_bytes = int64_t{2} << 30;

  // OK, or INVALID_ARGUMENT naming the flag that is wrong.
  absl::Status Validate() const;
};

// A member's address when none is given: `host`, or 127.0.0.1 for a
// wildcard one, and `port`.
std::string DefaultMember(const std::string& host, int port);

class ShardServer {
 public:
  // Validates `config`, restores the newest valid checkpoint in
  // checkpoint_dir (DATA_LOSS-free files only; damaged ones are logged and
  // skipped), and starts serving. `env`'s parts must outlive the server.
  static absl::StatusOr<std::unique_ptr<ShardServer>> Start(
      const ShardServerConfig& config, Env env = Env());
  ~ShardServer() { Shutdown(); }
  ShardServer(const ShardServer&) = delete;
  ShardServer& operator=(const ShardServer&) = delete;

  // The TCP port it listens on (0 when serving in-process only).
  int port() const { return port_; }
  // The data plane's port (0 when there is none), and the token its
  // connections present (what the DataPlane RPC answers).
  int data_port() const;
  std::string data_token() const;
  // Every worker of the job has finished (Membership::AllFinished).
  bool JobDone() const { return membership_.AllFinished(); }
  // A channel to this server that bypasses the network.
  std::shared_ptr<grpc::Channel> InProcessChannel();
  // The first half of Shutdown: the gRPC health service answers NOT_SERVING,
  // held calls are answered UNAVAILABLE, pushes are refused (UNAVAILABLE:
  // clients retry them, e.g. against the restarted shard), the data plane
  // closes, and the last checkpoint is written from the state this froze.
  // gRPC still answers (Stats, health) until Shutdown. Idempotent.
  void Drain();
  // Drains, lets in-flight gRPC calls finish for up to shutdown_grace and
  // stops. Idempotent.
  void Shutdown();

  ShardStore& store() { return store_; }
  // The member's replication (null unless config.replicated).
  Replication* replication() { return replication_.get(); }
  // Called by a member about to become its group's primary: the job's
  // workers registered with the old one, so until their heartbeats register
  // them here, they are presumed live (Membership::Restarted); a worker
  // registering first resumes at the job's front (NoteJobFront).
  void BecomingPrimary();
  const ShardServerConfig& config() const { return config_; }

 private:
  ShardServer(const ShardServerConfig& config, Env env,
              std::unique_ptr<Timeline> timeline);
  // Who hears of each call; null when no one listens.
  CallObserver* observer() {
    return observers_.empty() ? nullptr : &observers_;
  }
  absl::Status Restore();
  // bsp: tells the membership the job's front from the steps applied.
  void NoteJobFront();
  void NewCheckpointer();  // For checkpoint_dir.
  absl::Status Listen();
  void Housekeeping();
  void PeriodicCheckpoints();

  // Constant after construction.
  const ShardServerConfig config_;
  const Env env_;
  // The parts, in the order they are built (and so destroyed in reverse).
  // With --timeline only (null otherwise).
  const std::unique_ptr<Timeline> timeline_;
  const std::unique_ptr<CallTimeline> call_timeline_;
  // Per-call metrics, with a metrics port only (null otherwise).
  const std::unique_ptr<RpcMetrics> rpc_metrics_;
  CallObservers observers_;
  ShardStore store_;
  Membership membership_;
  EmbeddingTables tables_;  // Sparse rows, checkpointed with the model.
  Consistency consistency_;
  std::unique_ptr<Replication> replication_;  // Replicated members only.
  KvStore kv_;
  std::unique_ptr<Checkpointer> checkpointer_;
  std::unique_ptr<DataPlaneServer> data_plane_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<prometheus::Collectable> metrics_;
  std::unique_ptr<MetricsEndpoint> metrics_endpoint_;
  int port_ = 0;
  absl::Notification stop_;
  std::thread ticker_;
  std::thread checkpoints_;  // Periodic checkpoints, with a checkpoint_dir.

  absl::Mutex shutdown_mu_;
  bool drained_ ABSL_GUARDED_BY(shutdown_mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(shutdown_mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_SERVER_H_
