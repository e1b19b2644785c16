// Client::Impl, the asyncps::Client (include/asyncps/client.h) over
// PsClient and MembershipClient: names to tensor indices, the worker's
// clock and the versions of what it last pulled. Internal to //client:
// client_impl.cc holds the model (declare, adopt, names, optimizer state),
// client_data.cc the data calls (Pull, Push, PushPull), client_step.cc
// bsp's step (no-gradient marks, kept pushes, EndStep), client_recovery.cc
// its recovery of a shard that lost the model, asyncps_client.cc the public
// class, and worker_client.h what ps_worker builds on it.
#ifndef ASYNCPS_CLIENT_CLIENT_IMPL_H_
#define ASYNCPS_CLIENT_CLIENT_IMPL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "asyncps/client.h"
#include "client/embedding_client.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/mode.h"
#include "common/timeline.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

struct Snapshot::Rep {
  std::vector<SliceVersion> versions;  // Indexed like the partition's slices.
};

// The public optimizer options as the proto; INVALID_ARGUMENT naming a
// bad kind or value.
absl::StatusOr<v1::OptimizerSpec> ToSpec(const OptimizerOptions& o);
class Client::Impl {
 public:
  Impl(std::unique_ptr<PsClient> ps, Mode mode, int num_workers,
       int64_t slice_bytes)
      : ps_(std::move(ps)),
        embeddings_(ps_->caller(), {mode, [this] { return clock(); },
                                    [this] { return JoinedAt(); }}),
        mode_(mode),
        num_workers_(num_workers),
        slice_bytes_(slice_bytes) {}

  absl::Status Join(int rank, absl::Duration heartbeat) {
    ASSIGN_OR_RETURN(membership_,
                     MembershipClient::Join(ps_->caller(), rank, num_workers_,
                                            mode_, heartbeat));
    return absl::OkStatus();
  }

  absl::Status Declare(const std::vector<TensorSpec>& tensors,
                       const std::vector<absl::Span<const float>>& initial,
                       const OptimizerOptions& optimizer,
                       const std::string& model_name);
  // Declares `spec` as it is (the first declarer's `initial` weights win,
  // one buffer per tensor), each tensor travelling in wire[t]
  // (UNSPECIFIED or missing: the client's), and adopts it.
  absl::Status DeclareSpec(const v1::ModelSpec& spec,
                           const std::vector<absl::Span<const float>>& initial,
                           std::vector<v1::DType> wire = {});

  absl::Status Attach() {
    RETURN_IF_ERROR(ps_->FetchModel());
    RETURN_IF_ERROR(Adopt());
    return AwaitJoinedStep();
  }

  // `names` resolved (see Client::Resolve).
  absl::StatusOr<TensorSet> Resolve(
      const std::vector<std::string>& names) const;
  // FAILED_PRECONDITION unless `set` was resolved for the model held now;
  // INVALID_ARGUMENT unless `buffers` is its size.
  absl::Status CheckSet(const TensorSet& set, size_t buffers) const;

  absl::Status Pull(const TensorSet& set,
                    const std::vector<absl::Span<float>>& out,
                    const CallOptions& options);

  absl::Status Push(const TensorSet& set,
                    const std::vector<absl::Span<const float>>& grads,
                    const CallOptions& options);

  // options.optimizers as specs (`*specs` owns them) and per tensor
  // index; `*per_tensor` stays empty without them. INVALID_ARGUMENT naming
  // the tensor for a bad one or another kind than the declared one.
  absl::Status Optimizers(const std::vector<std::string>& names,
                          const std::vector<int>& indices,
                          const CallOptions& options,
                          std::vector<v1::OptimizerSpec>* specs,
                          TensorOptimizers* per_tensor) const;

  absl::Status PushPull(const TensorSet& set,
                        const std::vector<absl::Span<const float>>& grads,
                        const std::vector<absl::Span<float>>& out,
                        const CallOptions& options);

  absl::Status Recover(const absl::Status& failure,
                       const std::vector<absl::Span<float>>& weights,
                       Snapshot* snapshot);

  absl::Status Recover(const absl::Status& failure,
                       const std::vector<absl::Span<float>>& weights);

  void SetClock(int64_t clock) {
    if (membership_ != nullptr) membership_->clock()->store(clock);
  }

  // bsp: the tensors of `set` have no gradient from this rank in the step
  // in progress (Client::PushNoGradient).
  absl::Status PushNoGradient(const TensorSet& set);

  // Ends the step: in bsp, first tells the shards which tensors and
  // tables this rank sent nothing for in it (they count it with zero), so
  // no step waits for a gradient that will not come; a failure of that is
  // kept and returned by the next Pull, Push or PushPull (of the rows': by
  // the next row call).
  // Then clock() grows by one.
  void EndStep();

  int rank() const { return membership_ != nullptr ? membership_->rank() : -1; }
  // The front at which this worker joined an elastic job (0: a fixed one,
  // or at its start).
  int64_t JoinedAt() const {
    return membership_ != nullptr && membership_->elastic()
               ? membership_->start_clock()
               : 0;
  }
  int num_workers() const { return num_workers_; }
  int64_t clock() const {
    return membership_ != nullptr ? membership_->clock()->load() : 0;
  }

  Mode mode() const { return mode_; }

  absl::Status PullOptimizerState(const std::vector<std::string>& names,
                                  std::vector<OptimizerState>* state);

  absl::Status LoadOptimizerState(const std::vector<std::string>& names,
                                  const std::vector<OptimizerState>& state);
  std::string model_name() const {
    absl::MutexLock lock(&mu_);
    return model_.name();
  }
  int num_shards() const { return ps_->num_shards(); }
  Snapshot latest() const;
  TrafficStats traffic() const {
    const Traffic t = ps_->traffic();
    return {t.sent_bytes, t.received_bytes, t.retries};
  }
  PsClient* ps() const { return ps_.get(); }
  EmbeddingClient* embeddings() { return &embeddings_; }
  MembershipClient* membership() const { return membership_.get(); }

  std::vector<TensorSpec> tensors() const;

  // Leaves the job (MembershipClient::Leave). A failure of the last
  // EndStep waits for the next call, and there is none: it is logged
  // (WARNING) rather than lost without a word.
  void Leave();

 private:
  absl::Status MustBeWorker(const char* what) const;

  // INVALID_ARGUMENT naming the tensor and element of the first NaN or
  // infinity in `grads` (one per name), counted for the heartbeats
  // (MembershipClient::CountNonFinite).
  absl::Status CheckFinite(const std::vector<std::string>& names,
                           const std::vector<absl::Span<const float>>& grads);

  // INVALID_ARGUMENT unless `weights` holds every tensor at its size.
  absl::Status CheckWholeModel(
      const std::vector<absl::Span<float>>& weights) const;

  // True if this worker resumed past step 0 (its registration said so):
  // the job has trained even where no shard holds its model any more.
  bool JobTrained() const {
    return membership_ != nullptr && membership_->start_clock() > 0;
  }
  // Recover: true if `versions` hold a slice of `shard` pulled from the
  // servers (a worker that just started holds only initial weights).
  bool PulledFrom(int shard, const std::vector<SliceVersion>& versions) const;
  // Recover, with a copy never pulled while the job has trained: waits up to
  // kAwaitRestore for another worker to restore `shard`; true if one did.
  absl::StatusOr<bool> AwaitRestoreByAnother(int shard);
  // As long as a shard waits for a worker's copy (ps_server --restore_wait).
  static constexpr absl::Duration kAwaitRestore = absl::Seconds(10);

  // Takes the model PsClient adopted: names, and versions all unknown.
  absl::Status Adopt();
  // A worker that joined an elastic bsp job at its front M sends step M + 1
  // first, which a shard refuses before step M is applied there: once the
  // model is known (Declare, Attach) it pulls every tensor once, held until
  // that step is applied, so its first push may come before a pull of its
  // own. Once; nothing elsewhere.
  absl::Status AwaitJoinedStep();
  bool awaited_join_ = false;  // The trainer's thread only.

  // The indices of `names`, which `buffers` buffers go with.
  absl::StatusOr<std::vector<int>> Indices(
      const std::vector<std::string>& names, size_t buffers) const;
  absl::StatusOr<std::vector<int>> IndicesLocked(
      const std::vector<std::string>& names, size_t buffers) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  int NumTensors() const {
    absl::MutexLock lock(&mu_);
    return num_tensors_;
  }

  // The versions a push names: `options.from`'s, or a copy of the latest
  // pull's in `own`.
  const std::vector<SliceVersion>& From(const CallOptions& options,
                                        std::vector<SliceVersion>* own) const;

  std::vector<SliceVersion> Versions() const {
    absl::MutexLock lock(&mu_);
    return versions_;
  }

  // bsp: records that `indices` were pushed for `step`.
  void MarkPushed(const std::vector<int>& indices, int64_t step)
      ABSL_LOCKS_EXCLUDED(step_mu_);
  // bsp: those of `indices` EndStep of `step` told the shards this rank had
  // no gradient for (none if that step has not ended here).
  std::vector<int> NotPushedIn(const std::vector<int>& indices, int64_t step)
      ABSL_LOCKS_EXCLUDED(step_mu_);
  // bsp: whether `tensor` was pushed (or said to have no gradient) for
  // `step`, as MarkPushed recorded it.
  bool PushedLocked(int tensor, int64_t step) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(step_mu_);
  // bsp, after a pull of `step` was answered ABORTED: this rank's part of
  // the step for `indices` again: with `kept`, the gradients KeepPush kept
  // (the explicit form's caller sends its own: CallOptions::again), then
  // the no-gradient marks for the rest, stamped with `held`'s
  // incarnations. NOT_FOUND if nothing of the step is known here.
  absl::Status SendStepAgain(const std::vector<int>& indices, int64_t step,
                             const std::vector<SliceVersion>& held, bool kept);
  // The failure of the last EndStep's pushes, returned once.
  absl::Status TakeStepError() ABSL_LOCKS_EXCLUDED(step_mu_);
  // bsp, the implicit step: keeps a copy of a push's gradients (with the
  // versions and hyper-parameters it went with) until a push of a later
  // step, so that a pull of the step answered ABORTED (a shard lost them
  // with a restart) sends them again (PushKeptAgain) as the caller could
  // not: EndStep has moved the clock by then.
  void KeepPush(const std::vector<int>& indices, const ConstTensorViews& views,
                const std::vector<SliceVersion>& from,
                const std::vector<v1::OptimizerSpec>& specs, int64_t step)
      ABSL_LOCKS_EXCLUDED(kept_mu_);
  // Pushes again, as they went, the kept pushes of `step` that touch
  // `indices`. NOT_FOUND if none is kept.
  absl::Status PushKeptAgain(const std::vector<int>& indices, int64_t step)
      ABSL_LOCKS_EXCLUDED(kept_mu_);

  // Keeps what a pull of `indices` brought.
  void KeepVersions(const std::vector<int>& indices,
                    const std::vector<SliceVersion>& versions);

  const std::unique_ptr<PsClient> ps_;
  EmbeddingClient embeddings_;  // Over ps_'s caller.
  const Mode mode_;
  const int num_workers_;
  const int64_t slice_bytes_;
  std::unique_ptr<MembershipClient> membership_;

  // bsp: which tensors this rank pushed for step pushed_step_.
  absl::Mutex step_mu_;
  int64_t pushed_step_ ABSL_GUARDED_BY(step_mu_) = -1;
  std::vector<bool> pushed_ ABSL_GUARDED_BY(step_mu_);
  absl::Status step_error_ ABSL_GUARDED_BY(step_mu_);

  // bsp: this step's pushes, as KeepPush keeps them.
  struct KeptPush {
    std::vector<int> indices;
    std::vector<std::vector<float>> grads;  // Per index.
    std::vector<SliceVersion> from;
    std::vector<v1::OptimizerSpec> specs;  // Per index, or none.
  };
  absl::Mutex kept_mu_;
  int64_t kept_step_ ABSL_GUARDED_BY(kept_mu_) = -1;
  std::vector<KeptPush> kept_ ABSL_GUARDED_BY(kept_mu_);

  mutable absl::Mutex mu_;
  v1::ModelSpec model_ ABSL_GUARDED_BY(mu_);
  int num_tensors_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> index_ ABSL_GUARDED_BY(mu_);
  // Which adoption of a model this is (TensorSet::model_ names one).
  int64_t model_generation_ ABSL_GUARDED_BY(mu_) = 0;
  // Per slice, the version last pulled (what a push was computed from).
  std::vector<SliceVersion> versions_ ABSL_GUARDED_BY(mu_);
};

// A Client as `options` say, with pulls and pushes drawn on `timeline`
// (borrowed; may be null), also in mode "allreduce" (where the servers only
// hold rank 0's copy: ps_worker's own mode, which Client::Connect refuses).
absl::StatusOr<std::unique_ptr<Client::Impl>> ConnectImpl(
    const ClientOptions& options, Timeline* timeline);

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_CLIENT_IMPL_H_
