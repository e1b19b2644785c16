// SliceState: the mutable state of one slice a shard holds: its weights,
// version and optimizer slots, and (bsp) the sum of the step in progress.
// Asynchronous apply and bsp step accumulation are separate paths over it.
// Thread-safe: every method takes the slice's own lock.
#ifndef ASYNCPS_SERVER_SLICE_STATE_H_
#define ASYNCPS_SERVER_SLICE_STATE_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/mode.h"
#include "common/optimizer.h"
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"
#include "server/bsp_step.h"
#include "server/stale_weights.h"

namespace asyncps {

// What one gradient did to a slice.
struct SliceOutcome {
  int64_t version = 0;        // The slice's version afterwards.
  int64_t staleness = 0;      // Its version before minus the gradient's.
  bool dropped = false;       // Not applied: too stale (async) or late (bsp).
  bool applied = false;       // An optimizer update happened.
  bool step_applied = false;  // bsp: this gradient completed its step...
  bool step_short = false;    // ...with fewer gradients than live workers.
  bool step_pending = false;  // bsp: its step still waits for gradients.
  // --stale_policy=dc, a stale gradient: compensated, or applied as it is
  // (its version no longer held).
  bool compensated = false;
  bool uncompensated = false;
};

class SliceState {
 public:
  // `buffer`: a model buffer (TensorSpec.buffer), averaged, not trained.
  SliceState(const v1::OptimizerSpec& optimizer, size_t n, bool buffer = false);
  SliceState(const SliceState&) = delete;
  SliceState& operator=(const SliceState&) = delete;

  // Sets the initial weights to `fill(weights)`.
  template <typename Fill>
  void Initialize(Fill fill) {
    absl::MutexLock lock(&mu_);
    fill(absl::MakeSpan(weights_));
  }

  // OK if a gradient computed from `version` may be pushed (in bsp, by
  // `rank` for step `clock`, `quorum` ranks making a step) now; else the
  // reason, naming the slice as `name`. Versions and applied steps only
  // grow, so what passes here still holds later. bsp: a push for the step
  // after the pending one (applied + 2) by a rank missing from the pending
  // step says that rank is done with it: its share there was lost (a shard
  // restarted since it was sent) and counts as zero. OK if that completes
  // the pending step; UNAVAILABLE (ask again) if the step still waits for
  // other ranks; FAILED_PRECONDITION for a step further ahead.
  absl::Status CheckPush(int64_t version, bool bsp, int64_t clock, int rank,
                         int quorum, const std::string& name) const;

  // async/ssp: applies `grad` (computed from `version`) with the learning
  // rate scaled, compensated for its delay, or drops it, per `stale`. A buffer
  // moves 1/`live_workers` of the way to the pushed value instead.
  SliceOutcome ApplyAsync(const v1::OptimizerSpec& optimizer,
                          const StalePolicy& stale, int64_t version,
                          absl::Span<const float> grad, int live_workers = 1);

  // bsp: adds rank's gradient to step `clock`'s sum; the step's mean over
  // its ranks is applied once `quorum` ranks are in (a push for the step
  // after it, which CheckPush let through, first completes it with this
  // rank's share as zero). An empty `grad` is a
  // rank without a gradient for the slice this step: it counts and adds
  // zero (a buffer averages the values sent; a step with none leaves the
  // slice as it is). A gradient for a step already applied, or a second
  // one from the same rank, is dropped.
  SliceOutcome AddToStep(const v1::OptimizerSpec& optimizer, int rank,
                         int64_t clock, int64_t version,
                         absl::Span<const float> grad, int quorum,
                         int live_workers, absl::Time now);

  // bsp: applies the pending step if it has `quorum` gradients or its first
  // came `deadline` (if > 0) before `now`. step_applied says whether it
  // did, step_pending whether a step still waits.
  SliceOutcome CompleteStep(const v1::OptimizerSpec& optimizer, int quorum,
                            int live_workers, absl::Duration deadline,
                            absl::Time now);

  // bsp: a shard restored from an older checkpoint rejoins the job at the
  // step its workers are on: if fewer than `step` steps were applied, the
  // slice counts `step` as applied. A pending step `step` itself is kept
  // (its ranks are on it now; it completes as steps do); one before it
  // will not be completed by its ranks (its missing shares were lost with
  // a restart, or their ranks went on without it), and is applied first
  // with what it has, the ranks of `quorum` missing from it counting as
  // zero, counted as short (`*applied` says so): no gradient sent is
  // dropped. Returns true if it moved the slice.
  // `discard_pending`: the caller knows the job completed the pending step
  // elsewhere (a push stamped with an earlier incarnation says so): it is
  // applied short even if it is `step` itself.
  bool FastForward(const v1::OptimizerSpec& optimizer, int64_t step,
                   bool discard_pending, int quorum, SliceOutcome* applied);

  // bsp: true if step `clock` is the one this slice waits for and `rank`'s
  // gradient for it has not come (a pull of `rank` that followed its push
  // of that step then knows the gradient was lost); also for any step not
  // applied while the slice, restored from a worker's copy, has taken no
  // push since (every gradient in flight went to the dead incarnation).
  bool LacksGradient(int rank, int64_t clock) const;

  // bsp healing: if the pending step's first gradient came at least `bound`
  // before `now` and every rank of `live_ranks` missing from it is in
  // `not_sending` (it will not send it: MayHeal), applies the step with the
  // gradients it has, as a backup worker's missing share is left out;
  // `*left_out` gets the missing ranks. step_applied says whether it did.
  SliceOutcome Heal(const v1::OptimizerSpec& optimizer,
                    const std::vector<int>& live_ranks,
                    const NotSending& not_sending, absl::Duration bound,
                    absl::Time now, std::vector<int>* left_out);

  int64_t version() const;
  int64_t applied_step() const;

  // bsp: true once step `clock` has been applied.
  bool StepApplied(int64_t clock) const;

  // Writes the weights as `dtype` payload bytes into `data`; returns the
  // version.
  int64_t Read(v1::DType dtype, std::string* data) const;
  // Replaces the weights (allreduce, or a restore), with `version`. With
  // `steps_unknown` (a bsp restore from a worker's copy: how many steps the
  // job has done is not known here), the first bsp push, for step c, sets
  // the applied step to c - 1 (FastForward) instead of being refused as
  // ahead. REQUIRES: weights.size() == the slice's size.
  void Assign(std::vector<float> weights, int64_t version,
              bool steps_unknown = false);

  // The optimizer state as f32 payload bytes; returns the updates applied.
  int64_t ReadState(std::string* slot1, std::string* slot2) const;
  // How many values each optimizer slot holds (0: none kept).
  std::pair<size_t, size_t> StateSizes() const;
  // Replaces the optimizer state; false (nothing changed) if a slot's size
  // is not this slice's for its optimizer.
  bool LoadState(std::vector<float> slot1, std::vector<float> slot2,
                 int64_t steps);

  // Checkpoint form of the whole state (but the slice index); with
  // `pending`, also bsp's step in progress (a replica's snapshot).
  void Save(v1::SliceCheckpoint* out, bool pending = false) const;
  // Loads state saved by Save; false (nothing changed) if it does not fit.
  bool Load(const v1::SliceCheckpoint& in);
  // Copy on write (ShardStore::SnapshotLazily): Save(out, pending) of the
  // state as it is now, made before the slice's next change or at
  // FinishCopy, whichever comes first. `*out` must stay valid until
  // FinishCopy returns; a second CopyOnWrite first finishes the first.
  void CopyOnWrite(v1::SliceCheckpoint* out, bool pending);
  void FinishCopy();
  // bsp: whether a step is in progress (some gradients are in).
  bool StepPending() const;

 private:
  // bsp: true if `rank` is missing from the pending step, which it would
  // complete with `quorum`.
  bool CompletesPendingLocked(int rank, int quorum) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void SaveLocked(v1::SliceCheckpoint* out, bool pending) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Called by every change with the lock held, before it changes anything:
  // makes the copy CopyOnWrite asked for, if any is due.
  void CopyBeforeChangeLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies the mean of the pending step: over its ranks, or over `ranks`
  // if more (the missing ones count as zero).
  void ApplyStep(const v1::OptimizerSpec& optimizer, int live_workers,
                 SliceOutcome* outcome, int ranks = 0)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const bool buffer_;  // Constant after construction.
  mutable absl::Mutex mu_;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  OptimizerSlots slots_ ABSL_GUARDED_BY(mu_);
  int64_t version_ ABSL_GUARDED_BY(mu_) = 0;
  // bsp: the last step applied, and the sum of step applied_step_ + 1's
  // gradients so far, from these ranks, the first at step_first_.
  int64_t applied_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool steps_unknown_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<float> step_sum_ ABSL_GUARDED_BY(mu_);
  std::vector<int> step_ranks_ ABSL_GUARDED_BY(mu_);
  // Of step_ranks_, those that sent no gradient (they add zero).
  std::vector<int> step_absent_ ABSL_GUARDED_BY(mu_);
  absl::Time step_first_ ABSL_GUARDED_BY(mu_);
  // --stale_policy=dc: recent versions of the weights, and the compensated
  // gradient (kept to spare an allocation per push).
  StaleWeights stale_weights_ ABSL_GUARDED_BY(mu_);
  std::vector<float> compensated_ ABSL_GUARDED_BY(mu_);
  // --stale_policy=dca: DC-ASGD-a's running mean square of the gradients.
  std::vector<float> mean_square_ ABSL_GUARDED_BY(mu_);
  // CopyOnWrite's copy still to make (null: none), and its `pending`.
  v1::SliceCheckpoint* copy_to_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool copy_pending_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SLICE_STATE_H_
