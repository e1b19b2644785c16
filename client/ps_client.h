// PsClient: a worker's tensors on the shards. The model is declared (or
// adopted) once and partitioned into slices; one Pull, Push or PushPull
// fans out to every shard holding a slice of the tensors named, split to
// stay under the message limit, in each tensor's wire dtype. Pushes are
// retried (also past a deadline): each carries this client's id and a
// sequence number, and a shard applies it once however often it arrives.
// Recovery of a shard that lost the model (Redeclare, Restore) and the
// optimizer state (PullState, LoadState) are here too. The calls travel
// through a ShardCaller (client/shard_caller.h: transports, retries,
// secrets), which the other clients share: AdminClient, RendezvousClient,
// MembershipClient.
//
// Register first (Join, or MembershipClient), then declare, pull, push.
// Thread-safe: several threads may pull and push at once (e.g. a prefetch
// thread and a push thread); each call blocks only its caller.
#ifndef ASYNCPS_CLIENT_PS_CLIENT_H_
#define ASYNCPS_CLIENT_PS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "asyncps/client.h"
#include "client/shard_caller.h"
#include "common/compress.h"
#include "common/partitioner.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

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

// What one Push did, summed over its slices, is the public PushStats
// (include/asyncps/client.h): one type from the wire's PushResponse to the
// worker's step.
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

class PsClient {
 public:
  static absl::StatusOr<std::unique_ptr<PsClient>> Create(
      PsClientOptions options);

  // The connections this client calls through, for the other clients
  // (AdminClient, RendezvousClient, MembershipClient); borrowed.
  ShardCaller* caller() const { return caller_.get(); }
  // Registers as `rank` of `num_workers` with every shard, without
  // heartbeats (tools, tests; a training worker has MembershipClient).
  absl::Status Join(int rank, int num_workers);

  int num_shards() const { return caller_->num_shards(); }
  // The rank this client last registered as (-1: none yet).
  int rank() const { return caller_->rank(); }
  Traffic traffic() const { return caller_->traffic(); }

  // Declares `spec` on every shard (idempotent) and adopts its partition.
  // Only a registered worker creates the model: this client declares as
  // the rank it last registered as (none: PERMISSION_DENIED where the
  // model is not there yet). REQUIRES: spec.num_shards() == num_shards().
  absl::Status DeclareModel(const v1::ModelSpec& spec);
  // The same, with the model's initial weights (one view per tensor of
  // `spec`, in its order) instead of its initializers: every shard this
  // call creates the model on takes them, at version 0, before it serves
  // anyone; where the model was there already, they are not sent (the
  // first declarer's weights hold). Nor where the shard lost the model
  // after the job trained: some shard holds trained weights, or
  // `job_trained` (this worker resumes past step 0) says so; a worker that
  // pulled that shard's weights restores it (Client::Impl::Recover).
  absl::Status DeclareModel(const v1::ModelSpec& spec,
                            const ConstTensorViews& initial,
                            bool job_trained = false);

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
                    int64_t clock, PushStats* result);
  // `optimizers`, if given, is indexed by tensor: a non-null entry is the
  // hyper-parameters that tensor's gradient is applied with
  // (SliceData.optimizer).
  // `again`: the same gradients as this client's last push of these
  // tensors, sent again (CallOptions::again).
  absl::Status Push(absl::Span<const int> tensors,
                    const ConstTensorViews& grads,
                    const std::vector<SliceVersion>& versions, int rank,
                    int64_t clock, PushStats* result,
                    const TensorOptimizers* optimizers = nullptr,
                    bool again = false);

  // bsp: tells the shards of every slice of `tensors` that this rank has
  // no gradient for them in step `clock` (SliceData.no_gradient): each
  // counts the rank for the step and adds zero. Retried as Push is.
  // `versions` (indexed by slice; may be null) stamps each slice with the
  // incarnation of the weights held, as a push does, so a shard restored
  // behind the job knows the steps it lost and catches up.
  absl::Status PushNoGradient(
      absl::Span<const int> tensors, int rank, int64_t clock,
      const std::vector<SliceVersion>* versions = nullptr);

  // Push, then pull the same slices, in one round trip per shard: `weights`
  // and `new_versions` (indexed like Pull's) get the weights after the
  // gradients were applied (retried as Push is: applied once).
  absl::Status PushPull(absl::Span<const int> tensors,
                        const std::vector<std::vector<float>>& grads,
                        const std::vector<SliceVersion>& versions, int rank,
                        int64_t clock, std::vector<std::vector<float>>* weights,
                        std::vector<SliceVersion>* new_versions,
                        PushStats* result);
  absl::Status PushPull(absl::Span<const int> tensors,
                        const ConstTensorViews& grads,
                        const std::vector<SliceVersion>& versions, int rank,
                        int64_t clock, const TensorViews& weights,
                        std::vector<SliceVersion>* new_versions,
                        PushStats* result,
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
  // Which shards lost the model, and whether the job has trained: some
  // shard that has the model holds weights changed since the initial ones.
  // A worker whose copy never came from the servers (it just started)
  // holds only the initial weights then, which must not replace a lost
  // shard's trained ones while a worker that pulled them can.
  struct ModelPresence {
    std::vector<int> lost;
    bool trained = false;
  };
  absl::StatusOr<ModelPresence> Presence();

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
  // As Redeclare, as the first declaration (the weights follow from this
  // client, not from a worker's trained copy).
  absl::StatusOr<bool> DeclareAgain(int shard);
  // Sends `shard` this worker's copy of its slices: `weights` (one vector
  // per tensor) at `versions` (indexed like partition().slices()).
  absl::Status Restore(int shard,
                       const std::vector<std::vector<float>>& weights,
                       const std::vector<SliceVersion>& versions, int rank);
  absl::Status Restore(int shard, const ConstTensorViews& weights,
                       const std::vector<SliceVersion>& versions, int rank);
  // Sends `shard`, on which this client created the adopted model, its
  // initial weights at version 0 (DeclareModel's second half). A shard
  // that restarted without a checkpoint in between has lost the
  // declaration: it is declared there again, and sent the weights again
  // if this client created it anew. A shard that already took another
  // declarer's copy keeps it (initial weights are the same on every
  // worker; a worker's trained copy is newer).
  absl::Status SendInitialWeights(int shard, const ConstTensorViews& initial);

  // REQUIRES: a model was declared or adopted.
  const Partition& partition() const { return *partition_; }
  const v1::ModelSpec& spec() const { return spec_; }

 private:
  explicit PsClient(std::unique_ptr<ShardCaller> caller);

  template <typename Request, typename Response>
  using Call = ShardCall<Request, Response>;

  // Declares the adopted model on `shard`, as lost (recover) or as new
  // (weights follow); true if this call created it.
  absl::StatusOr<bool> DeclareOne(int shard, bool recover);
  // Declares `spec` on every shard but those in `skip` (`calls` gets their
  // answers) and, once they took it, adopts it.
  absl::Status DeclareOnShards(
      const v1::ModelSpec& spec, bool weights_follow,
      const std::vector<int>& skip,
      std::vector<Call<v1::DeclareModelRequest, v1::DeclareModelResponse>>*
          calls);

  // The push of slices `batch` of `grads`, computed from `versions`, with
  // this client's id and the next sequence number.
  void FillPush(const std::vector<int>& batch, const ConstTensorViews& grads,
                const std::vector<SliceVersion>& versions, int rank,
                int64_t clock, const TensorOptimizers* optimizers,
                v1::PushRequest* request, bool again = false);

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

  // Assign requests for every slice of `tensors` as `rank` (with
  // load_state: the optimizer state, not the weights), each slice's
  // SliceData written by fill(const SliceInfo&, v1::SliceData*).
  template <typename Fill>
  absl::Status AssignSlices(absl::Span<const int> tensors, int rank,
                            bool load_state, Fill fill);

  // Groups the slices of `tensors` by shard and wire dtype (a request's
  // answer has one), in requests of at most max_message_bytes of payload.
  std::vector<std::vector<int>> Batches(absl::Span<const int> tensors) const;
  // The wire dtype of one of Batches' batches.
  v1::DType BatchDtype(const std::vector<int>& batch) const {
    return wire_dtypes_[partition_->slices()[batch[0]].tensor];
  }

  const std::unique_ptr<ShardCaller> caller_;
  const PsClientOptions& options_;  // The caller's.
  v1::ModelSpec spec_;
  std::optional<Partition> partition_;
  std::vector<v1::DType> wire_dtypes_;  // Per tensor of spec_.
  // Gradients' encoding and error feedback (options_.compress).
  Compressor compressor_;
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_PS_CLIENT_H_
