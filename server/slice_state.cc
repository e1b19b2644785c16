#include "server/slice_state.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "server/bsp_step.h"

namespace asyncps {

namespace {

// A buffer keeps no optimizer state.
v1::OptimizerSpec SlotsFor(const v1::OptimizerSpec& optimizer, bool buffer) {
  return buffer ? v1::OptimizerSpec() : optimizer;
}

}  // namespace

SliceState::SliceState(const v1::OptimizerSpec& optimizer, size_t n,
                       bool buffer)
    : buffer_(buffer), weights_(n), slots_(SlotsFor(optimizer, buffer), n) {}

absl::Status SliceState::CheckPush(int64_t version, bool bsp, int64_t clock,
                                   int rank, int quorum,
                                   const std::string& name) const {
  absl::MutexLock lock(&mu_);
  if (version > version_) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient for slice ", name, " claims version ", version,
                     " but the slice is only at version ", version_));
  }
  if (bsp && clock == applied_step_ + 2 && !steps_unknown_ &&
      !step_ranks_.empty() &&
      std::find(step_ranks_.begin(), step_ranks_.end(), rank) ==
          step_ranks_.end()) {
    if (CompletesPendingLocked(rank, quorum)) return absl::OkStatus();
    const std::string waits =
        quorum == kUnknownQuorum
            ? std::string("ranks this restarted shard has not heard from")
            : absl::StrCat(quorum - static_cast<int>(step_ranks_.size()) - 1,
                           " more rank(s)");
    return absl::UnavailableError(absl::StrCat(
        "bsp step ", clock, " for slice ", name, " pushed while step ",
        applied_step_ + 1, " waits for ", waits, "; ask again"));
  }
  if (bsp && clock > applied_step_ + 1 && !steps_unknown_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bsp step ", clock, " for slice ", name, " pushed before step ",
        applied_step_ + 1, " was applied"));
  }
  return absl::OkStatus();
}

SliceOutcome SliceState::ApplyAsync(const v1::OptimizerSpec& optimizer,
                                    const StalePolicy& stale, int64_t version,
                                    absl::Span<const float> grad,
                                    int live_workers) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  SliceOutcome out;
  out.staleness = version_ - version;
  if (buffer_) {
    const float share = 1.0f / static_cast<float>(std::max(1, live_workers));
    for (size_t e = 0; e < weights_.size(); ++e) {
      weights_[e] += (grad[e] - weights_[e]) * share;
    }
    ++version_;
    out.applied = true;
  } else if (stale.kind == StalePolicy::kDrop &&
             out.staleness > stale.max_staleness) {
    out.dropped = true;
  } else {
    const float scale = stale.kind == StalePolicy::kScale
                            ? 1.0f / (1.0f + static_cast<float>(out.staleness))
                            : 1.0f;
    const bool compensate = stale.kind == StalePolicy::kCompensate;
    absl::Span<const float> g = grad;
    if (compensate) {
      // The window starts with the weights the first push finds.
      if (stale_weights_.empty()) {
        stale_weights_.Record(version_, weights_, stale.dc_window);
      }
      absl::Span<const float> old;  // Empty: no w_v to compensate with.
      if (out.staleness > 0) {
        old = stale_weights_.Find(version);
        if (old.size() != weights_.size()) old = {};
        (old.empty() ? out.uncompensated : out.compensated) = true;
      }
      compensated_.resize(weights_.size());
      if (stale.dc_adaptive) {
        // The running mean square takes every gradient, stale or not.
        mean_square_.resize(weights_.size(), 0.0f);
        AdaptiveDelayCompensate(stale.dc_lambda, grad, weights_, old,
                                absl::MakeSpan(mean_square_),
                                absl::MakeSpan(compensated_));
        g = compensated_;
      } else if (!old.empty()) {
        DelayCompensate(stale.dc_lambda, grad, weights_, old,
                        absl::MakeSpan(compensated_));
        g = compensated_;
      }
    }
    slots_.Apply(optimizer, scale, g, absl::MakeSpan(weights_));
    ++version_;
    out.applied = true;
    if (compensate) stale_weights_.Record(version_, weights_, stale.dc_window);
  }
  out.version = version_;
  return out;
}

SliceOutcome SliceState::AddToStep(const v1::OptimizerSpec& optimizer, int rank,
                                   int64_t clock, int64_t version,
                                   absl::Span<const float> grad, int quorum,
                                   int live_workers, absl::Time now) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  if (steps_unknown_) {
    // The first step pushed after a restore is the one the job is on.
    step_ranks_.clear();
    applied_step_ = std::max(applied_step_, clock - 1);
    steps_unknown_ = false;
  }
  SliceOutcome out;
  out.staleness = version_ - version;
  if (clock == applied_step_ + 2 && CompletesPendingLocked(rank, quorum)) {
    // The rank is done with the pending step (CheckPush): its share there
    // was lost and counts as zero, which completes the step.
    step_ranks_.push_back(rank);
    step_absent_.push_back(rank);
    SliceOutcome done;
    ApplyStep(optimizer, live_workers, &done);
    out.step_short = true;
  }
  const bool duplicate = std::find(step_ranks_.begin(), step_ranks_.end(),
                                   rank) != step_ranks_.end();
  if (clock <= applied_step_ || duplicate) {
    out.dropped = true;
  } else {
    if (step_ranks_.empty()) {
      step_sum_.assign(weights_.size(), 0.0f);
      step_absent_.clear();
      step_first_ = now;
    }
    if (grad.empty()) {
      step_absent_.push_back(rank);  // No gradient: counts, adds zero.
    } else {
      for (size_t e = 0; e < grad.size(); ++e) step_sum_[e] += grad[e];
    }
    step_ranks_.push_back(rank);
    if (static_cast<int>(step_ranks_.size()) >= quorum) {
      ApplyStep(optimizer, live_workers, &out);
    }
  }
  out.step_pending = !step_ranks_.empty();
  out.version = version_;
  return out;
}

SliceOutcome SliceState::CompleteStep(const v1::OptimizerSpec& optimizer,
                                      int quorum, int live_workers,
                                      absl::Duration deadline, absl::Time now) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  SliceOutcome out;
  if (StepDue(step_ranks_, quorum, deadline, step_first_, now)) {
    ApplyStep(optimizer, live_workers, &out);
  }
  out.step_pending = !step_ranks_.empty();
  out.version = version_;
  return out;
}

SliceOutcome SliceState::Heal(const v1::OptimizerSpec& optimizer,
                              const std::vector<int>& live_ranks,
                              const NotSending& not_sending,
                              absl::Duration bound, absl::Time now,
                              std::vector<int>* left_out) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  SliceOutcome out;
  if (MayHeal(step_ranks_, step_first_, applied_step_ + 1, live_ranks,
              not_sending, bound, now, left_out)) {
    ApplyStep(optimizer, static_cast<int>(live_ranks.size()), &out);
  }
  out.step_pending = !step_ranks_.empty();
  out.version = version_;
  return out;
}

void SliceState::ApplyStep(const v1::OptimizerSpec& optimizer, int live_workers,
                           SliceOutcome* outcome, int ranks) {
  const size_t sent = step_ranks_.size() - step_absent_.size();
  const size_t n = std::max(step_ranks_.size(), static_cast<size_t>(ranks));
  // A gradient's mean is over every rank of the step, a rank without one
  // adding zero (DDP's rule); a buffer's value is the mean of those sent.
  // A step nobody sent anything for changes nothing but the step count.
  if (sent > 0) {
    const float inv = 1.0f / static_cast<float>(buffer_ ? sent : n);
    for (float& g : step_sum_) g *= inv;
    if (buffer_) {
      weights_ = step_sum_;  // The mean of the step's values.
    } else {
      slots_.Apply(optimizer, 1.0f, step_sum_, absl::MakeSpan(weights_));
    }
  }
  ++version_;
  ++applied_step_;
  step_ranks_.clear();
  step_absent_.clear();
  outcome->applied = true;
  outcome->step_applied = true;
  outcome->step_short = static_cast<int>(n) < live_workers;
}

bool SliceState::CompletesPendingLocked(int rank, int quorum) const {
  return !step_ranks_.empty() &&
         std::find(step_ranks_.begin(), step_ranks_.end(), rank) ==
             step_ranks_.end() &&
         static_cast<int>(step_ranks_.size()) + 1 >= quorum;
}

bool SliceState::FastForward(const v1::OptimizerSpec& optimizer, int64_t step,
                             bool discard_pending, int quorum,
                             SliceOutcome* applied) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  // `step` is a step the job completed (a rank reported step + 1). The
  // pending step may be that very step and still legitimately wait: a rank
  // that did not pull this slice went on, and a slower rank's gradient is
  // on its way. So it is kept, and completes as steps do (quorum, deadline,
  // healing). A pending step before it is stale: every rank had sent its
  // share of it (EndStep's no-gradient marks come before the next step's
  // pushes) before any rank could complete `step`, so what is missing was
  // lost with a restarted shard (or its rank went on without it), and
  // nobody will send it again. Its gradients were acknowledged: it is
  // applied with them, short, never dropped, the ranks of the quorum
  // missing from it counting as zero (as a share lost with a restart does).
  if (applied_step_ >= step) return false;
  if (!step_ranks_.empty()) {
    if (!discard_pending && applied_step_ + 1 >= step) return false;
    ApplyStep(optimizer, /*live_workers=*/0, applied,
              quorum == kUnknownQuorum ? 0 : quorum);
    applied->step_short = true;
  }
  applied_step_ = std::max(applied_step_, step);
  return true;
}

bool SliceState::LacksGradient(int rank, int64_t clock) const {
  absl::MutexLock lock(&mu_);
  // Restored from a worker's copy and pushed nothing since: no gradient of
  // any step the job has not completed is here (each went to the dead
  // incarnation).
  if (steps_unknown_) return clock > applied_step_;
  return clock == applied_step_ + 1 &&
         std::find(step_ranks_.begin(), step_ranks_.end(), rank) ==
             step_ranks_.end();
}

int64_t SliceState::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

int64_t SliceState::applied_step() const {
  absl::MutexLock lock(&mu_);
  return applied_step_;
}

bool SliceState::StepApplied(int64_t clock) const {
  absl::MutexLock lock(&mu_);
  return applied_step_ >= clock;
}

int64_t SliceState::Read(v1::DType dtype, std::string* data) const {
  absl::MutexLock lock(&mu_);
  EncodeTensor(dtype, weights_, data);
  return version_;
}

void SliceState::Assign(std::vector<float> weights, int64_t version,
                        bool steps_unknown) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  weights_ = std::move(weights);
  version_ = version;
  stale_weights_.Clear();
  steps_unknown_ = steps_unknown;
}

int64_t SliceState::ReadState(std::string* slot1, std::string* slot2) const {
  absl::MutexLock lock(&mu_);
  EncodeF32(slots_.slot1(), slot1);
  EncodeF32(slots_.slot2(), slot2);
  return slots_.steps();
}

std::pair<size_t, size_t> SliceState::StateSizes() const {
  absl::MutexLock lock(&mu_);
  return {slots_.slot1().size(), slots_.slot2().size()};
}

bool SliceState::LoadState(std::vector<float> slot1, std::vector<float> slot2,
                           int64_t steps) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  return slots_.Restore(std::move(slot1), std::move(slot2), steps);
}

void SliceState::Save(v1::SliceCheckpoint* out, bool pending) const {
  absl::MutexLock lock(&mu_);
  SaveLocked(out, pending);
}

void SliceState::CopyOnWrite(v1::SliceCheckpoint* out, bool pending) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  copy_to_ = out;
  copy_pending_ = pending;
}

void SliceState::FinishCopy() {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
}

void SliceState::CopyBeforeChangeLocked() {
  if (copy_to_ == nullptr) return;
  SaveLocked(copy_to_, copy_pending_);
  copy_to_ = nullptr;
}

void SliceState::SaveLocked(v1::SliceCheckpoint* out, bool pending) const {
  EncodeF32(weights_, out->mutable_weights());
  EncodeF32(slots_.slot1(), out->mutable_slot1());
  EncodeF32(slots_.slot2(), out->mutable_slot2());
  out->set_version(version_);
  out->set_optimizer_steps(slots_.steps());
  out->set_applied_step(applied_step_);
  if (!mean_square_.empty()) {
    EncodeF32(mean_square_, out->mutable_dca_mean_square());
  }
  if (!pending) return;
  out->set_steps_unknown(steps_unknown_);
  if (step_ranks_.empty()) return;
  EncodeF32(step_sum_, out->mutable_step_sum());
  for (int r : step_ranks_) out->add_step_ranks(r);
  for (int r : step_absent_) out->add_step_absent_ranks(r);
  out->set_step_first_unix_nanos(absl::ToUnixNanos(step_first_));
}

bool SliceState::StepPending() const {
  absl::MutexLock lock(&mu_);
  return !step_ranks_.empty();
}

bool SliceState::Load(const v1::SliceCheckpoint& in) {
  absl::MutexLock lock(&mu_);
  CopyBeforeChangeLocked();
  std::vector<float> w, s1, s2, sum, ms;
  if (!DecodeF32Vector(in.weights(), &w) || w.size() != weights_.size() ||
      !DecodeF32Vector(in.dca_mean_square(), &ms) ||
      (!ms.empty() && ms.size() != weights_.size()) ||
      !DecodeF32Vector(in.slot1(), &s1) || !DecodeF32Vector(in.slot2(), &s2) ||
      !DecodeF32Vector(in.step_sum(), &sum) ||
      (in.step_ranks_size() > 0 && sum.size() != weights_.size()) ||
      in.version() < 0 || in.applied_step() < 0 ||
      !slots_.Restore(std::move(s1), std::move(s2), in.optimizer_steps())) {
    return false;
  }
  weights_ = std::move(w);
  version_ = in.version();
  stale_weights_.Clear();
  mean_square_ = std::move(ms);
  applied_step_ = in.applied_step();
  steps_unknown_ = in.steps_unknown();
  step_ranks_.assign(in.step_ranks().begin(), in.step_ranks().end());
  step_absent_.assign(in.step_absent_ranks().begin(),
                      in.step_absent_ranks().end());
  if (!step_ranks_.empty()) {
    step_sum_ = std::move(sum);
    step_first_ = absl::FromUnixNanos(in.step_first_unix_nanos());
  }
  return true;
}

}  // namespace asyncps
