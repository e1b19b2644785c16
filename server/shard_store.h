// ShardStore: the slices of a model that one shard holds, and the rules for
// reading and updating them. The declared model's fixed part is a
// ShardModel, each slice's mutable state a SliceState, the counters a
// ShardCounterSet; this class puts them together per request. Thread-safe:
// pulls and pushes to different slices run in parallel; each slice has its
// own lock.
#ifndef ASYNCPS_SERVER_SHARD_STORE_H_
#define ASYNCPS_SERVER_SHARD_STORE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/mode.h"
#include "common/optimizer.h"
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint_stream.h"
#include "server/shard_counters.h"
#include "server/shard_model.h"
#include "server/slice_state.h"

namespace asyncps {

// How a push is applied, decided by the server's mode and membership.
struct PushPolicy {
  Mode mode = Mode::kAsync;
  StalePolicy stale;
  // bsp: gradients that complete a step (live workers - backup workers), and
  // the live worker count (a step applied with fewer is "short").
  int quorum = 1;
  int live_workers = 1;
  absl::Time now;
};

class ShardStore {
 public:
  // REQUIRES: 0 <= shard < num_shards. `max_shard_bytes` bounds the weights
  // this shard will hold (the optimizer's slots come on top: up to 2x more
  // for Adam); a bigger model is refused with RESOURCE_EXHAUSTED instead of
  // running the process out of memory. `incarnation` (nonzero) is stamped
  // on every slice answered; gradients stamped with another are from
  // before a restart.
  ShardStore(int shard, int num_shards, uint64_t max_response_bytes,
             uint64_t max_shard_bytes = uint64_t{4} << 30,
             uint64_t incarnation = 1);
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // Declares the model and initialises this shard's slices from the spec's
  // seed. The same spec again is OK (created = false); a different one is
  // FAILED_PRECONDITION naming the difference; an unusable one, or one whose
  // num_shards is not this server's, is INVALID_ARGUMENT / FAILED_PRECONDITION.
  absl::StatusOr<v1::DeclareModelResponse> Declare(const v1::ModelSpec& spec);

  // Copies the requested slices and their versions into `response`.
  // On error `response` is unspecified and nothing changed.
  absl::Status Pull(const v1::PullRequest& request, v1::PullResponse* response);
  // Pull in two halves, for pulls the server holds: ResolvePull validates
  // and returns the slices; FinishPull copies them out.
  absl::StatusOr<std::vector<int>> ResolvePull(const v1::PullRequest& request);
  void FinishPull(const v1::PullRequest& request,
                  const std::vector<int>& slices, v1::PullResponse* response);

  // Validates every gradient in `request` first (known slice on this shard,
  // matching range, dtype, byte length, finite values, version not from the
  // future, no slice twice, a bsp step that is not ahead); if any fails
  // nothing is applied. A gradient stamped with an earlier incarnation is
  // not checked against versions it never saw: async/ssp drop it, bsp
  // fast-forwards the slice to the pushed step (SliceState::FastForward)
  // and adds it there. Then, per slice under its lock:
  // - async/ssp: applies the optimizer (the learning rate scaled, or the
  //   gradient dropped, per `policy.stale`);
  // - bsp: adds the gradient to its step's sum; the step's mean is applied
  //   once `policy.quorum` gradients are in; a gradient for a step already
  //   applied (or a second one from the same rank) is dropped.
  absl::Status Push(const v1::PushRequest& request, const PushPolicy& policy,
                    v1::PushResponse* response);
  // Async push with no stale policy (tests, tools).
  absl::Status Push(const v1::PushRequest& request,
                    v1::PushResponse* response) {
    return Push(request, PushPolicy{}, response);
  }

  // bsp: applies every pending step that has `quorum` gradients, or whose
  // first gradient is older than `deadline` (if > 0). Returns the number of
  // steps applied.
  int CompletePendingSteps(int quorum, int live_workers,
                           absl::Duration deadline, absl::Time now);
  // bsp: the job has completed step `step` (a worker said so): every slice
  // behind it (restored from an older checkpoint) counts it as applied,
  // but one with gradients of that step in (SliceState::FastForward),
  // unless `discard_pending` (a push stamped with an earlier incarnation
  // says the job completed it); a pending step it passes is applied short
  // with the gradients it has, the ranks of `quorum` missing from it
  // counting as zero. Returns the slices moved.
  int FastForwardTo(int64_t step, int quorum, bool discard_pending = false);
  // bsp: true if some slice of `slices` waits for step `clock` without
  // `rank`'s gradient for it.
  bool LacksGradient(const std::vector<int>& slices, int rank,
                     int64_t clock) const;
  // bsp healing: applies each pending step whose first gradient is older
  // than `bound` and whose missing live ranks are all in `not_sending`
  // (they will not send it: MayHeal), with the gradients it has.
  // Each step so applied is counted as short and described in `*healed`.
  int HealPendingSteps(const std::vector<int>& live_ranks,
                       const NotSending& not_sending, absl::Duration bound,
                       absl::Time now, std::vector<std::string>* healed);
  // bsp: what one housekeeping tick does to the steps (Consistency::
  // AdvanceSteps): FastForwardTo(fast_forward_to), CompletePendingSteps,
  // and with `heal`, HealPendingSteps. One value, so that a replicated
  // shard's backups do exactly what the primary did.
  struct StepAdvance {
    int64_t fast_forward_to = 0;
    int quorum = 1;
    int live_workers = 0;
    absl::Duration deadline;
    absl::Time now;
    bool heal = false;
    std::vector<int> live_ranks;
    NotSending not_sending;
    absl::Duration heal_after;
  };
  struct StepsAdvanced {
    int moved = 0;      // Slices fast-forwarded.
    int completed = 0;  // Steps applied (quorum or deadline).
    std::vector<std::string> healed;
    bool changed() const { return moved + completed > 0 || !healed.empty(); }
  };
  StepsAdvanced AdvanceSteps(const StepAdvance& advance);
  // The lowest and highest step applied (bsp) or version (otherwise) over
  // this shard's slices; (0, 0) before Declare.
  std::pair<int64_t, int64_t> Progress(bool bsp) const;
  // bsp: true if step `clock` has been applied to every slice in `slices`.
  bool StepApplied(const std::vector<int>& slices, int64_t clock) const;

  // The whole state of this shard (weights, versions, optimizer slots, bsp
  // steps), for a checkpoint; with `pending`, also each slice's bsp step in
  // progress (a replica's snapshot). FAILED_PRECONDITION before Declare.
  absl::StatusOr<v1::ShardCheckpoint> Snapshot(bool pending = false) const;
  // The same, given to `sink` piece by piece (server/checkpoint_stream.h):
  // the head (spec, shard, `unix_micros`), then each slice, copied under its
  // own lock one at a time, so a shard of any size costs one slice's copy.
  // Does not call the sink's Finish; returns its first error.
  absl::Status Snapshot(bool pending, int64_t unix_micros,
                        CheckpointSink* sink) const;
  // The same into `head` and `slices` (one per slice of this shard, in
  // order), reusing what they hold (a copy made into the buffers of an
  // earlier one allocates nothing when the model is the same), copied on
  // write (a joining backup's snapshot): called under the lock that orders
  // every change to this store (the replication order lock), it fills
  // `head` and sets each slice to save itself into `*slices` before its
  // next change (SliceState::CopyOnWrite); LazyCopy::Finish, without that
  // lock, saves those not changed since. The changes wait for the
  // marking, not for the copy. `*slices` must not be touched until Finish
  // returns; destroying the LazyCopy finishes it.
  class LazyCopy {
   public:
    LazyCopy() = default;
    LazyCopy(const LazyCopy&) = delete;
    LazyCopy& operator=(const LazyCopy&) = delete;
    ~LazyCopy() { Finish(); }
    void Finish();

   private:
    friend class ShardStore;
    std::shared_ptr<const void> model_;  // Keeps slices_ alive.
    std::vector<SliceState*> slices_;
  };
  absl::StatusOr<std::unique_ptr<LazyCopy>> SnapshotLazily(
      bool pending, int64_t unix_micros, v1::ShardCheckpoint* head,
      std::vector<v1::SliceCheckpoint>* slices) const;
  // Loads a checkpoint into an empty store: its spec is declared and every
  // slice's state restored. DATA_LOSS if it does not fit the model on this
  // shard; nothing changes on error.
  absl::Status Restore(const v1::ShardCheckpoint& checkpoint);
  // The same, a slice at a time: StartRestore with the checkpoint's head
  // (its spec and shard; FAILED_PRECONDITION if another shard's, the spec's
  // own error if unusable), Load each slice into what it returns (the
  // model, served by no one yet), then FinishRestore publishes it: DATA_LOSS
  // if a slice of this shard did not come, FAILED_PRECONDITION if a model
  // was declared meanwhile. Dropping the Restoring changes nothing.
  class Restoring;
  absl::StatusOr<std::unique_ptr<Restoring>> StartRestore(
      const v1::ShardCheckpoint& head) const;
  absl::Status FinishRestore(std::unique_ptr<Restoring> restoring);

  // Replaces weights (allreduce mode, or a restore), validated like a
  // push's gradients; each slice's version becomes the given one. With
  // `steps_unknown` (a bsp restore) each slice takes its step from the
  // first push (SliceState::Assign).
  absl::Status Assign(const v1::AssignRequest& request,
                      bool steps_unknown = false);

  // Replaces the optimizer state of the request's slices (AssignRequest.
  // load_state); INVALID_ARGUMENT naming the slice, and nothing changed, if
  // any does not fit.
  absl::Status LoadState(const v1::AssignRequest& request);

  int shard() const { return shard_; }
  uint64_t incarnation() const { return incarnation_; }
  // The declared spec, or FAILED_PRECONDITION before Declare.
  absl::StatusOr<v1::ModelSpec> Spec() const;
  bool declared() const;
  // Slices and payload bytes held; zero before Declare.
  uint32_t num_slices() const;
  uint64_t num_bytes() const;
  // --max_shard_bytes: the most bytes of weights a model may put here.
  uint64_t max_shard_bytes() const { return max_shard_bytes_; }
  std::string model_name() const;
  ShardCounters Counters() const;
  // Counts an RPC refused before it reached the store (e.g. a bad Register).
  void CountRejected() { counters_.Add(ShardCounter::kRejected); }
  void CountDuplicatePush() { counters_.Add(ShardCounter::kDuplicatePushes); }

 private:
  // A declared model and the state of its slices on this shard. Published
  // whole, once; the slice pointers never change afterwards.
  struct Model {
    std::unique_ptr<const ShardModel> model;
    // Indexed like partition().slices(); null for slices on other shards.
    std::vector<std::unique_ptr<SliceState>> slices;
  };

  // The model of `spec` with this shard's slices at their initial weights.
  absl::StatusOr<std::shared_ptr<Model>> BuildModel(
      const v1::ModelSpec& spec) const;
  std::shared_ptr<const Model> model() const;
  absl::Status Reject(absl::Status status);
  // Whether `g` was computed against another incarnation of this shard
  // (before it restarted).
  bool Restarted(const v1::SliceData& g) const;
  // A push's checks before any weight moves: each gradient's optimizer is
  // the declared kind and valid, and each slice takes it (SliceState::
  // CheckPush, with `quorum` ranks to a bsp step). The error, counted as a
  // rejection, names the slice.
  absl::Status CheckPush(const Model& m, const v1::PushRequest& request,
                         const std::vector<int>& indices, bool bsp, int quorum);

  // Constant after construction.
  const int shard_;
  const int num_shards_;
  const uint64_t max_response_bytes_;
  const uint64_t max_shard_bytes_;
  const uint64_t incarnation_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Model> model_ ABSL_GUARDED_BY(mu_);

  ShardCounterSet counters_;

  // bsp: the slices with a step pending now, and one that has none.
  std::vector<int> PendingSlices() const;
  void NotPending(int slice);
  // bsp: slices with a step pending.
  mutable absl::Mutex pending_mu_;
  absl::flat_hash_set<int> pending_ ABSL_GUARDED_BY(pending_mu_);
};

// A restore in progress (ShardStore::StartRestore). Not thread-safe.
class ShardStore::Restoring {
 public:
  // DATA_LOSS (nothing loaded) if `slice` is not on this shard, came
  // before, or does not fit the model.
  absl::Status Load(const v1::SliceCheckpoint& slice);

 private:
  friend class ShardStore;
  explicit Restoring(std::shared_ptr<Model> model);

  std::shared_ptr<Model> model_;
  std::vector<bool> loaded_;
  uint32_t count_ = 0;
  // Slices with a bsp step in progress (a replica's snapshot).
  std::vector<int> pending_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_STORE_H_
