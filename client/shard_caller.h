// ShardCaller: how every client reaches the shards, and nothing else. A
// batch of calls (one per shard, or several) goes out at once, each with a
// deadline: tensor calls (Exchange) over each shard's data plane (plain
// TCP, client/data_channel.h) with --transport=tcp or over gRPC's callback
// API with --transport=grpc; every other call (CallAll, CallOne) over gRPC,
// one channel per shard, reused. UNAVAILABLE is retried with capped
// exponential backoff until `retry_for` has passed, then the call fails
// with a message naming the shard; idempotent calls are retried past a
// deadline too.
//
// A rank's calls carry the secret its registration with that shard
// answered (Register keeps it; every request is stamped as it is sent, so
// a retry after a registration again carries the new one): a shard refuses
// a call acting as a rank without it.
//
// The clients above it: PsClient (tensors), AdminClient (stats,
// checkpoints), RendezvousClient (the store on shard 0), MembershipClient
// (register, heartbeats). Thread-safe; each call blocks only its caller.
#ifndef ASYNCPS_CLIENT_SHARD_CALLER_H_
#define ASYNCPS_CLIENT_SHARD_CALLER_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/data_channel.h"
#include "common/backoff.h"
#include "common/clock.h"
#include "common/cluster_spec.h"
#include "common/compress.h"
#include "common/security.h"
#include "common/status.h"
#include "common/timeline.h"
#include "common/transport_kind.h"
#include "proto/asyncps.grpc.pb.h"
#include "rpc/grpc_status.h"

// The callback-API call of one ParameterServer method, for CallAll.
#define ASYNCPS_RPC(Method)                                               \
  [](v1::ParameterServer::Stub* stub, grpc::ClientContext* ctx,           \
     const auto* req, auto* resp, std::function<void(grpc::Status)> cb) { \
    stub->async()->Method(ctx, req, resp, std::move(cb));                 \
  }

namespace asyncps {

// A client's connections to the shards, and how its tensors travel.
struct PsClientOptions {
  std::vector<ServerAddress> servers;  // Shard i at servers[i].
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long a shard may stay UNAVAILABLE before a call gives up.
  absl::Duration retry_for = absl::Seconds(60);
  absl::Duration backoff_initial = absl::Milliseconds(50);
  absl::Duration backoff_max = absl::Seconds(2);
  int64_t max_message_bytes = 64 << 20;
  // The dtype gradients and weights travel in (F32, BF16, F16) unless a
  // tensor is given its own (PsClient::SetWireDtypes); the servers keep
  // f32 either way.
  v1::DType wire_dtype = v1::DTYPE_F32;
  // How gradients travel to the servers (common/compress.h; error feedback
  // on this client); kNone: in their wire dtype.
  Compression compress;
  Transport transport = Transport::kTcp;
  // Time for deadlines and backoff; borrowed, must outlive the client.
  Clock* clock = Clock::Real();
  // Pull, Push and PushPull calls are spans here (--timeline); borrowed,
  // may be null.
  Timeline* timeline = nullptr;
  // TLS and the token every call carries (common/security.h).
  Security security;
};

// What a client has moved so far (its metrics): bytes of tensor requests
// sent and answers received (Pull, Push, PushPull, as messages), and
// attempts repeated after UNAVAILABLE or a timeout.
struct Traffic {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t retries = 0;
};

// One request to one shard, and where its answer goes.
template <typename Request, typename Response>
struct ShardCall {
  int shard = 0;
  Request request;
  Response response;
};

// The longest wait between two attempts of a call to a replicated shard
// (ps_server --replicas): while it fails over, its members are asked again
// this often (each attempt that finds a member down or a backup moves on to
// the next member). A promotion takes tens of milliseconds (the backup
// sees its primary's stream break), so the wait must not be what a worker
// waits for; an attempt on a member that is down or not primary costs the
// member a refused connection or a short answer.
inline constexpr absl::Duration kGroupBackoffMax = absl::Milliseconds(25);

// Payload bytes kept free in each request for keys and framing.
inline constexpr int64_t kRequestOverhead = 64 << 10;

class ShardCaller {
 public:
  template <typename Request, typename Response>
  using Call = ShardCall<Request, Response>;

  // INVALID_ARGUMENT for no servers or a message limit below
  // 2 * kRequestOverhead.
  static absl::StatusOr<std::unique_ptr<ShardCaller>> Create(
      PsClientOptions options);

  const PsClientOptions& options() const { return options_; }
  int num_shards() const { return static_cast<int>(members_.size()); }
  // The rank this client last registered as (-1: none yet).
  int rank() const { return rank_.load(); }
  Traffic traffic() const {
    return {sent_bytes_.load(), received_bytes_.load(), retries_.load()};
  }
  // Exactly-once pushes: this client's id (random, per process start) and
  // a fresh sequence number per push request.
  uint64_t client_id() const { return client_id_; }
  uint64_t NextSequence() { return sequence_.fetch_add(1) + 1; }

  // Every call over gRPC, retried.
  template <typename Request, typename Response, typename Method>
  absl::Status CallAll(std::vector<Call<Request, Response>>* calls,
                       Method method, const char* what,
                       bool idempotent = false);
  // A tensor call (Pull, Push, PushPull) over options().transport, retried.
  template <typename Request, typename Response, typename Method>
  absl::Status Exchange(std::vector<Call<Request, Response>>* calls, FrameOp op,
                        Method method, const char* what,
                        bool idempotent = false);
  // One call to one shard, through CallAll.
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> CallOne(int shard, const Request& request,
                                   Method method, const char* what,
                                   bool idempotent = false);
  // Runs every call with `attempt` (which sends the calls it is given at
  // once, each stamped with its rank's secret as GrpcAttempt does, and
  // returns their statuses), retrying UNAVAILABLE ones (and, for
  // idempotent calls such as a pull an ssp/bsp server held,
  // DEADLINE_EXCEEDED ones) with backoff; returns the first other error,
  // annotated with the shard and `what`.
  template <typename Request, typename Response, typename Attempt>
  absl::Status Retry(std::vector<Call<Request, Response>>* calls,
                     Attempt attempt, const char* what, bool idempotent);
  // One attempt of `calls` over gRPC, with `method`, each stamped. With
  // `end_early` (calls a shard may hold: MayHold), the first answer that is
  // not OK ends the attempt: the calls still out are cancelled and come
  // back UNAVAILABLE (NotWaitedFor), so that Retry acts on that answer at
  // once. A bsp pull one shard holds must not keep a worker from hearing
  // that another shard restarted (UNAVAILABLE) or wants its push again
  // (ABORTED): that push may be what the held pull waits for.
  template <typename Request, typename Response, typename Method>
  std::vector<absl::Status> GrpcAttempt(
      const std::vector<Call<Request, Response>*>& calls, Method method,
      bool end_early = false);

  // A replicated shard's members (1 for a shard of one process), and one
  // call to one of them, not retried and not moving on: psctl's view of
  // each member of a group.
  int num_members(int shard) const {
    return static_cast<int>(members_[shard].size());
  }
  const ServerAddress& member_address(int shard, int member) const {
    return members_[shard][member].address;
  }
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> CallMember(int shard, int member,
                                      const Request& request, Method method);

  // Registers with one shard and keeps the secret it answers, which this
  // client's later calls as that rank carry (and a registration again
  // presents, so the same worker may re-join while live).
  absl::StatusOr<v1::RegisterResponse> Register(int shard,
                                                const v1::RegisterRequest& req);

 private:
  explicit ShardCaller(PsClientOptions options);

  // One attempt of `calls` over the data planes, as `op` frames, each
  // stamped; answers are read as they come. For an op a shard may hold,
  // a request that cannot go out or the first answer that is not OK ends
  // the attempt as in GrpcAttempt (the connections not read are closed).
  template <typename Request, typename Response>
  std::vector<absl::Status> TcpAttempt(
      const std::vector<Call<Request, Response>*>& calls, FrameOp op);

  // True for the ops whose answer a shard may hold (ssp, bsp).
  static bool MayHold(FrameOp op) {
    return op == FrameOp::kPull || op == FrameOp::kPushPull ||
           op == FrameOp::kPullRows;
  }
  // What a call not waited for (another's answer ended the attempt) says,
  // and whether `s` is that.
  static absl::Status NotWaitedFor(int shard);
  static bool WasNotWaitedFor(const absl::Status& s);

  // The registration secret for `rank` on `shard` (0: none), and stamping
  // it on a request as it is sent. Requests that act as no rank are left
  // alone.
  uint64_t SecretFor(int shard, int rank) const;
  void Stamp(int shard, v1::PullRequest* r) const;
  void Stamp(int shard, v1::PushRequest* r) const;
  void Stamp(int shard, v1::PushPullRequest* r) const;
  void Stamp(int shard, v1::AssignRequest* r) const;
  void Stamp(int shard, v1::DeclareModelRequest* r) const;
  void Stamp(int shard, v1::RegisterRequest* r) const;
  void Stamp(int shard, v1::HeartbeatRequest* r) const;
  void Stamp(int shard, v1::StoreSetRequest* r) const;
  void Stamp(int shard, v1::DeclareEmbeddingRequest* r) const;
  void Stamp(int shard, v1::PullRowsRequest* r) const;
  void Stamp(int shard, v1::PushRowsRequest* r) const;
  void Stamp(int shard, v1::ReadRowsRequest* r) const;
  template <typename Request>
  void Stamp(int, Request*) const {}
  // Requests that act as whatever rank this client registered as (-1:
  // none): that rank and its secret.
  template <typename Request>
  void StampAsThisRank(int shard, Request* r) const {
    r->set_rank(rank_.load());
    r->set_secret(SecretFor(shard, r->rank()));
  }

  // A context for one call: `deadline`, and the token if there is one.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const;
  // The data-plane address of member `member` of `shard`, asked once (no
  // retry) by `deadline`.
  absl::StatusOr<DataPlaneAddress> DiscoverDataPlane(int shard, int member,
                                                     absl::Time deadline);

  // One process of a shard: the only one, or a member of its replicated
  // group (ServerAddress::others).
  struct Member {
    ServerAddress address;
    std::unique_ptr<v1::ParameterServer::Stub> stub;
    std::unique_ptr<DataChannel> data;  // --transport=tcp only.
  };
  // The member of `shard` calls go to now, and its index.
  int Current(int shard) const { return current_[shard].load(); }
  Member& Serving(int shard) { return members_[shard][Current(shard)]; }
  v1::ParameterServer::Stub* Stub(int shard) {
    return Serving(shard).stub.get();
  }
  DataChannel& Data(int shard) { return *Serving(shard).data; }
  // After member `tried` of `shard` answered UNAVAILABLE (it is down, or
  // a backup): the next member is tried, unless another call moved on
  // already.
  void NextMember(int shard, int tried);

  const PsClientOptions options_;
  // members_[shard]: the shard's processes (one, unless replicated).
  std::vector<std::vector<Member>> members_;
  std::unique_ptr<std::atomic<int>[]> current_;
  const uint64_t client_id_;
  std::atomic<uint64_t> sequence_{0};
  std::atomic<int64_t> sent_bytes_{0};
  std::atomic<int64_t> received_bytes_{0};
  std::atomic<int64_t> retries_{0};
  // Registration secrets by (shard, rank). `registrations_started_` counts
  // the Register calls sent, `registrations_ended_` those that came back
  // (answered or failed): a call refused PERMISSION_DENIED is tried again
  // when a registration it did not see the end of was under way meanwhile.
  // The shard holds the new secret from before its answer arrives, so a
  // call stamped with the old one may be refused before the new one is
  // here; the retry waits for it.
  mutable absl::Mutex secrets_mu_;
  absl::flat_hash_map<std::pair<int, int>, uint64_t> secrets_
      ABSL_GUARDED_BY(secrets_mu_);
  std::atomic<int64_t> registrations_started_{0};
  std::atomic<int64_t> registrations_ended_{0};
  // The rank this client last registered as (-1: none): who declares.
  std::atomic<int> rank_{-1};
};

}  // namespace asyncps

#include "client/shard_caller_inl.h"  // IWYU pragma: export

#endif  // ASYNCPS_CLIENT_SHARD_CALLER_H_
