// PsClient: a worker's connection to every shard of the parameter server.
// One Pull or Push fans out to all shards at once, each call with a
// deadline: over each shard's data plane (plain TCP, client/data_channel.h)
// with --transport=tcp, over gRPC's callback API (one channel per shard,
// reused) with --transport=grpc; every other call goes over gRPC. Requests are
// split to stay under the message limit; UNAVAILABLE is retried with capped
// exponential backoff until `retry_for` has passed, then the call fails with
// a message naming the shard. Pushes are retried too (also past a
// deadline): each carries this client's id and a sequence number, and a
// shard applies it once however often it arrives.
//
// A rank's calls carry the secret its registration with that shard
// answered (Register keeps it): a shard refuses a call acting as a rank
// without it. Register first (Join, or MembershipClient), then declare,
// pull, push.
//
// Thread-safe: several threads may pull and push at once (e.g. a prefetch
// thread and a push thread); each call blocks only its caller.
#ifndef ASYNCPS_CLIENT_PS_CLIENT_H_
#define ASYNCPS_CLIENT_PS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/data_channel.h"
#include "common/clock.h"
#include "common/cluster_spec.h"
#include "common/partitioner.h"
#include "common/rendezvous_store.h"
#include "common/security.h"
#include "common/timeline.h"
#include "proto/asyncps.grpc.pb.h"

namespace asyncps {

// How Pull, Push and PushPull travel (the other calls always use gRPC).
enum class Transport {
  kTcp,   // The shards' data planes: framed TCP, no protobuf copies.
  kGrpc,  // The gRPC service.
};

// "tcp" or "grpc" (--transport); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<Transport> ParseTransport(absl::string_view text);

struct PsClientOptions {
  std::vector<ServerAddress> servers;  // Shard i at servers[i].
  absl::Duration rpc_timeout = absl::Seconds(30);
  // How long a shard may stay UNAVAILABLE before a call gives up.
  absl::Duration retry_for = absl::Seconds(60);
  absl::Duration backoff_initial = absl::Milliseconds(50);
  absl::Duration backoff_max = absl::Seconds(2);
  int64_t max_message_bytes = 64 << 20;
  // The dtype gradients and weights travel in (F32, BF16, F16); the servers
  // keep f32 either way.
  v1::DType wire_dtype = v1::DTYPE_F32;
  Transport transport = Transport::kTcp;
  // Time for deadlines and backoff; borrowed, must outlive the client.
  Clock* clock = Clock::Real();
  // Pull, Push and PushPull calls are spans here (--timeline); borrowed,
  // may be null.
  Timeline* timeline = nullptr;
  // TLS and the token every call carries (common/security.h).
  Security security;
};

// What a pull brought of one slice: its version, and the incarnation of
// the shard that answered it. A push carries both back, so a shard that
// restarted since knows the gradient was computed against weights it no
// longer has.
struct SliceVersion {
  int64_t version = 0;
  uint64_t incarnation = 0;  // 0: unknown; the version is taken as it is.

  friend bool operator==(const SliceVersion& a, const SliceVersion& b) {
    return a.version == b.version && a.incarnation == b.incarnation;
  }
};

// What one Push did, summed over its slices.
struct PushResult {
  int64_t slices = 0;
  int64_t total_staleness = 0;
  int64_t max_staleness = 0;
  int64_t dropped = 0;     // Slices the server did not apply (stale or late).
  int64_t front_step = 0;  // bsp: the newest step applied on those slices.
};

// What a client has moved so far (its metrics): bytes of tensor requests
// sent and answers received (Pull, Push, PushPull, as messages), and
// attempts repeated after UNAVAILABLE or a timeout.
struct Traffic {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t retries = 0;
};

// Views of one buffer per tensor of the model, indexed by tensor (only
// the tensors a call names are read or written; each must hold the
// tensor's element count): callers' own memory, e.g. numpy arrays, which
// pulls decode into and pushes encode from without a copy in between.
using ConstTensorViews = std::vector<absl::Span<const float>>;
using TensorViews = std::vector<absl::Span<float>>;

// Per tensor (by index): the hyper-parameters its gradient is applied
// with, or null for the declared ones. Borrowed for the call.
using TensorOptimizers = std::vector<const v1::OptimizerSpec*>;

// One tensor's optimizer state on the servers (SliceData.slot1, slot2):
// each slot empty where the optimizer keeps none, else the tensor's
// element count; `steps` the updates applied (its first slice's).
struct TensorSlots {
  std::vector<float> slot1, slot2;
  int64_t steps = 0;
};

class PsClient final : public RendezvousStore {
 public:
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      PsClientOptions options);

  int num_shards() const { return static_cast<int>(stubs_.size()); }
  // The rank this client last registered as (-1: none yet).
  int rank() const { return rank_.load(); }

  Traffic traffic() const {
    return {sent_bytes_.load(), received_bytes_.load(), retries_.load()};
  }

  // Declares `spec` on every shard (idempotent) and adopts its partition.
  // Only a registered worker creates the model: this client declares as
  // the rank it last registered as (none: PERMISSION_DENIED where the
  // model is not there yet). REQUIRES: spec.num_shards() == num_shards().
  absl::Status DeclareModel(const v1::ModelSpec& spec);
  // The same, with the model's initial weights (one view per tensor of
  // `spec`, in its order) instead of its initializers: every shard this
  // call creates the model on takes them, at version 0, before it serves
  // anyone; where the model was there already, they are not sent (the
  // first declarer's weights hold).
  absl::Status DeclareModel(const v1::ModelSpec& spec,
                            const ConstTensorViews& initial);

  // Fetches the spec declared on shard 0, waiting (with backoff, up to
  // retry_for) while none is declared yet, and adopts it.
  absl::Status FetchModel();

  // Adopts `spec`'s partition without declaring it.
  absl::Status UseModel(const v1::ModelSpec& spec);

  // The dtype each tensor of the adopted model travels in (gradients out,
  // weights back): dtypes[t] for tensor t (F32, BF16, F16), instead of
  // options.wire_dtype, e.g. a bf16 parameter's own. The servers keep f32
  // either way. INVALID_ARGUMENT for a wrong count or dtype. Not to be
  // called while tensor calls are under way; adopting a model again
  // resets it to options.wire_dtype.
  absl::Status SetWireDtypes(const std::vector<v1::DType>& dtypes);
  v1::DType WireDtype(int tensor) const { return wire_dtypes_[tensor]; }

  // Pulls every slice of the given tensors: values[t] (sized to tensor t's
  // element count) gets the weights, versions[slice] each slice's version
  // (versions is indexed like partition().slices()). `rank` and `clock`
  // tell the server who asks (rank -1: not a training worker). What
  // `versions` holds on entry tells a bsp shard which incarnation the
  // caller's weights came from (see PullRequest.incarnation).
  // REQUIRES: a model was declared or adopted.
  absl::Status Pull(absl::Span<const int> tensors,
                    std::vector<std::vector<float>>* values,
                    std::vector<SliceVersion>* versions, int rank,
                    int64_t clock);
  // The same into caller-owned buffers; INVALID_ARGUMENT naming the tensor
  // if a view's size is not the tensor's element count.
  // `after_push`: see PullRequest.after_push.
  absl::Status Pull(absl::Span<const int> tensors, const TensorViews& values,
                    std::vector<SliceVersion>* versions, int rank,
                    int64_t clock, bool after_push = false);

  // Pushes gradients for every slice of the given tensors; grads[t] holds
  // tensor t's gradient, versions[slice] the version it was computed from.
  absl::Status Push(absl::Span<const int> tensors,
                    const std::vector<std::vector<float>>& grads,
                    const std::vector<SliceVersion>& versions, int rank,
                    int64_t clock, PushResult* result);
  // `optimizers`, if given, is indexed by tensor: a non-null entry is the
  // hyper-parameters that tensor's gradient is applied with
  // (SliceData.optimizer).
  absl::Status Push(absl::Span<const int> tensors,
                    const ConstTensorViews& grads,
                    const std::vector<SliceVersion>& versions, int rank,
                    int64_t clock, PushResult* result,
                    const TensorOptimizers* optimizers = nullptr);

  // Push, then pull the same slices, in one round trip per shard: `weights`
  // and `new_versions` (indexed like Pull's) get the weights after the
  // gradients were applied (retried as Push is: applied once).
  absl::Status PushPull(absl::Span<const int> tensors,
                        const std::vector<std::vector<float>>& grads,
                        const std::vector<SliceVersion>& versions, int rank,
                        int64_t clock, std::vector<std::vector<float>>* weights,
                        std::vector<SliceVersion>* new_versions,
                        PushResult* result);
  absl::Status PushPull(absl::Span<const int> tensors,
                        const ConstTensorViews& grads,
                        const std::vector<SliceVersion>& versions, int rank,
                        int64_t clock, const TensorViews& weights,
                        std::vector<SliceVersion>* new_versions,
                        PushResult* result,
                        const TensorOptimizers* optimizers = nullptr);

  // Replaces the weights of every slice of `tensors` on the servers
  // (allreduce mode), each slice's version set to `version`.
  absl::Status Assign(absl::Span<const int> tensors,
                      const std::vector<std::vector<float>>& weights,
                      int64_t version, int rank);

  // Recovery of a shard that restarted without a checkpoint and so lost
  // the model (its pulls and pushes fail with FAILED_PRECONDITION):
  // The shards that answer that no model is declared.
  absl::StatusOr<std::vector<int>> ShardsWithoutModel();

  // The optimizer state of `tensors`, read as no worker (nothing waits):
  // (*state)[t] for each t in `tensors`.
  absl::Status PullState(absl::Span<const int> tensors,
                         std::vector<TensorSlots>* state);
  // Replaces the optimizer state of `tensors` with state[t] (Assign with
  // load_state), as `rank`; the weights stay.
  absl::Status LoadState(absl::Span<const int> tensors,
                         const std::vector<TensorSlots>& state, int rank);
  // Declares the adopted model on `shard` again, saying it was lost; true
  // if this call created it (the shard then waits for Restore).
  absl::StatusOr<bool> Redeclare(int shard);
  // Sends `shard` this worker's copy of its slices: `weights` (one vector
  // per tensor) at `versions` (indexed like partition().slices()).
  absl::Status Restore(int shard,
                       const std::vector<std::vector<float>>& weights,
                       const std::vector<SliceVersion>& versions, int rank);
  absl::Status Restore(int shard, const ConstTensorViews& weights,
                       const std::vector<SliceVersion>& versions, int rank);

  // The rendezvous store on shard 0. It lives in shard 0's memory, so a
  // restart loses it: this client remembers what it set (the last
  // kRememberedSets keys) and sets it again while it waits for a key.
  absl::Status StoreSet(const std::string& key,
                        const std::string& value) override;
  // Waits up to `wait` for the key, a second at a time; between waits it
  // sets its own keys again (another rank may be waiting for them on a
  // shard 0 that restarted since they were set).
  absl::StatusOr<std::string> StoreGet(const std::string& key,
                                       absl::Duration wait) override;
  static constexpr size_t kRememberedSets = 256;
  // One StoreSet call to shard 0 (not remembered).
  absl::Status SetOnShard0(const std::string& key, const std::string& value);

  // Registers with one shard and keeps the secret it answers, which this
  // client's later calls as that rank carry (and a registration again
  // presents, so the same worker may re-join while live).
  absl::StatusOr<v1::RegisterResponse> Register(int shard,
                                                const v1::RegisterRequest& req);
  // Registers as `rank` of `num_workers` with every shard, without
  // heartbeats (tools, tests; a training worker has MembershipClient).
  absl::Status Join(int rank, int num_workers);
  absl::Status Heartbeat(int shard, const v1::HeartbeatRequest& req);
  absl::StatusOr<v1::StatsResponse> Stats(int shard);
  // Asks a shard to write a checkpoint now; returns the file's path there.
  absl::StatusOr<std::string> Checkpoint(int shard);
  // A job checkpoint: every shard written at the same model version (bsp:
  // the same applied step on every slice; async/ssp: with no update applied
  // anywhere between the first file and the last), as "job-<tag>-shard-
  // <i>.ckpt"; returns the paths in shard order. Pushes wait (retried by
  // the workers) for at most the time this takes; the shards resume by
  // themselves after `lease` should this client die meanwhile.
  absl::StatusOr<std::vector<std::string>> JobCheckpoint(
      const std::string& tag, absl::Duration lease = absl::Seconds(60));
  // Stats of every shard, in shard order.
  absl::StatusOr<std::vector<v1::StatsResponse>> StatsAll();

  // REQUIRES: a model was declared or adopted.
  const Partition& partition() const { return *partition_; }
  const v1::ModelSpec& spec() const { return spec_; }

 private:
  explicit PsClient(PsClientOptions options);

  // One request to one shard, and where its answer goes.
  template <typename Request, typename Response>
  struct Call {
    int shard = 0;
    Request request;
    Response response;
  };

  // Runs every call with `attempt` (which sends the calls it is given at
  // once and returns their statuses), retrying UNAVAILABLE ones (and, for
  // idempotent calls such as a pull an ssp/bsp server held,
  // DEADLINE_EXCEEDED ones) with backoff; returns the first other error,
  // annotated with the shard and `what`.
  template <typename Request, typename Response, typename Attempt>
  absl::Status Retry(std::vector<Call<Request, Response>>* calls,
                     Attempt attempt, const char* what, bool idempotent);
  // One attempt of `calls` over gRPC, with `method`.
  template <typename Request, typename Response, typename Method>
  std::vector<absl::Status> GrpcAttempt(
      const std::vector<Call<Request, Response>*>& calls, Method method);
  // One attempt of `calls` over the data planes, as `op` frames.
  template <typename Request, typename Response>
  std::vector<absl::Status> TcpAttempt(
      const std::vector<Call<Request, Response>*>& calls, FrameOp op);
  // Every call over gRPC, retried.
  template <typename Request, typename Response, typename Method>
  absl::Status CallAll(std::vector<Call<Request, Response>>* calls,
                       Method method, const char* what,
                       bool idempotent = false);
  // A tensor call (Pull, Push, PushPull) over options_.transport, retried.
  template <typename Request, typename Response, typename Method>
  absl::Status Exchange(std::vector<Call<Request, Response>>* calls, FrameOp op,
                        Method method, const char* what,
                        bool idempotent = false);
  // The registration secret for `rank` on `shard` (0: none), and stamping
  // it on a request as it is sent (a retry after a registration again
  // carries the new one). Requests that act as no rank are left alone.
  uint64_t SecretFor(int shard, int rank) const;
  void Stamp(int shard, v1::PullRequest* r) const;
  void Stamp(int shard, v1::PushRequest* r) const;
  void Stamp(int shard, v1::PushPullRequest* r) const;
  void Stamp(int shard, v1::AssignRequest* r) const;
  void Stamp(int shard, v1::DeclareModelRequest* r) const;
  void Stamp(int shard, v1::RegisterRequest* r) const;
  void Stamp(int shard, v1::HeartbeatRequest* r) const;
  template <typename Request>
  void Stamp(int, Request*) const {}

  // Declares `spec` on every shard (`calls` gets their answers) and, once
  // they took it, adopts it.
  absl::Status DeclareOnEveryShard(
      const v1::ModelSpec& spec, bool weights_follow,
      std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>>*
          calls);

  // A context for one call: `deadline`, and the token if there is one.
  std::unique_ptr<grpc::ClientContext> NewContext(absl::Time deadline) const;

  // Shard `shard`'s data-plane address, asked once (no retry) by `deadline`.
  absl::StatusOr<DataPlaneAddress> DiscoverDataPlane(int shard,
                                                     absl::Time deadline);

  // One call to one shard, through CallAll.
  template <typename Response, typename Request, typename Method>
  absl::StatusOr<Response> CallOne(int shard, const Request& request,
                                   Method method, const char* what,
                                   bool idempotent = false) {
    std::vector<Call<Request, Response>> calls(1);
    calls[0].shard = shard;
    calls[0].request = request;
    absl::Status s = CallAll(&calls, method, what, idempotent);
    if (!s.ok()) return s;
    return std::move(calls[0].response);
  }

  // The push of slices `batch` of `grads`, computed from `versions`, with
  // this client's id and the next sequence number.
  void FillPush(const std::vector<int>& batch, const ConstTensorViews& grads,
                const std::vector<SliceVersion>& versions, int rank,
                int64_t clock, const TensorOptimizers* optimizers,
                v1::PushRequest* request);

  // Copies one shard's answered weights (slices `batch`, in order) into
  // `values` and `versions`; INTERNAL if the answer does not fit.
  absl::Status TakeWeights(int shard, const std::vector<int>& batch,
                           const v1::PullResponse& response,
                           const TensorViews& values,
                           std::vector<SliceVersion>* versions) const;
  // INVALID_ARGUMENT unless views[t] holds tensor t's element count for
  // every t of `tensors`.
  template <typename View>
  absl::Status CheckViews(absl::Span<const int> tensors,
                          const std::vector<View>& views,
                          const char* what) const;

  // Groups the slices of `tensors` by shard and wire dtype (a request's
  // answer has one), in requests of at most max_message_bytes of payload.
  std::vector<std::vector<int>> Batches(absl::Span<const int> tensors) const;
  // The wire dtype of one of Batches' batches.
  v1::DType BatchDtype(const std::vector<int>& batch) const {
    return wire_dtypes_[partition_->slices()[batch[0]].tensor];
  }

  const PsClientOptions options_;
  std::vector<std::unique_ptr<v1::ParameterServer::Stub>> stubs_;
  // --transport=tcp: shard i's data plane at data_[i].
  std::vector<std::unique_ptr<DataChannel>> data_;
  v1::ModelSpec spec_;
  std::optional<Partition> partition_;
  std::vector<v1::DType> wire_dtypes_;  // Per tensor of spec_.
  // Exactly-once pushes: this client's id (random, per process start) and
  // the last sequence number used.
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
  absl::Mutex sets_mu_;
  // What StoreSet set, oldest first (for setting it again).
  std::vector<std::pair<std::string, std::string>> sets_
      ABSL_GUARDED_BY(sets_mu_);
  mutable absl::Mutex secrets_mu_;
  absl::flat_hash_map<std::pair<int, int>, uint64_t> secrets_
      ABSL_GUARDED_BY(secrets_mu_);
  std::atomic<int64_t> registrations_started_{0};
  std::atomic<int64_t> registrations_ended_{0};
  // The rank this client last registered as (-1: none): who declares.
  std::atomic<int> rank_{-1};
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PS_CLIENT_H_
