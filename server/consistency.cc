#include "server/consistency.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/optimizer.h"
#include "common/status.h"
#include "glog/logging.h"
#include "server/bsp_step.h"

namespace asyncps {

absl::Status Consistency::PushAgain(int shard, int rank, int64_t clock) {
  LOG(WARNING) << "shard " << shard << ": rank " << rank << " waits for step "
               << clock << " without its gradient here: asked to push again";
  return absl::AbortedError(absl::StrCat(
      "shard ", shard, " waits for step ", clock,
      " without this worker's gradient for it (lost on the way): push it "
      "again, then pull"));
}

absl::Status ConsistencyConfig::Validate() const {
  if (staleness < 0) {
    return absl::InvalidArgumentError("--staleness must not be negative");
  }
  if (backup_workers < 0) {
    return absl::InvalidArgumentError("--backup_workers must not be negative");
  }
  if (step_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--step_deadline must not be negative");
  }
  if (max_held_per_rank < 1) {
    return absl::InvalidArgumentError("max_held_per_rank must be at least 1");
  }
  if (heal_after < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--heal_after must not be negative");
  }
  if (stall_warn < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--stall_warn must not be negative");
  }
  if (restore_wait < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--restore_wait must not be negative");
  }
  if (stale.kind == StalePolicy::kCompensate &&
      (mode == Mode::kBsp || mode == Mode::kAllreduce)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--stale_policy=dc compensates async and ssp gradients for their "
        "delay; --mode=",
        ModeName(mode),
        mode == Mode::kBsp
            ? " applies each step to the weights its gradients "
              "came from (no delay to compensate)"
            : " keeps no weights on the servers to apply it to"));
  }
  return absl::OkStatus();
}

Consistency::Consistency(ConsistencyConfig config, ShardStore* store,
                         Membership* membership, Clock* clock,
                         EmbeddingTables* tables, int num_shards)
    : config_(config),
      store_(store),
      membership_(membership),
      clock_(clock),
      tables_(tables),
      num_shards_(num_shards) {}

void Consistency::Shutdown() {
  waiters_.Close();
  row_waiters_.Close();
}

bool Consistency::Joining() const {
  if (membership_->Registered() >= membership_->Expected()) return false;
  // A worker at this clock could only get there once every worker had
  // joined (bsp: step 1 waited for all; ssp: the slowest was past 0): a
  // shard that restarted since does not wait for workers that finished
  // and left before it came back.
  const int64_t started =
      config_.mode == Mode::kSsp ? config_.staleness + 2 : 2;
  return membership_->MaxClock() < started;
}

int Consistency::Quorum(int live) const {
  // Until every worker the job expects has registered once, a step waits
  // for all of them (as Horovod's first collective does); afterwards for
  // the live ones and, for --worker_timeout after this shard (re)started or
  // was promoted, those it has not heard from since (Membership::Presumed):
  // without them a step would go with the first rank back, whole, and drop
  // the others' gradients as late. While the job's size is unknown in that
  // window, no step goes by count (a deadline or the window's end moves it).
  int members = membership_->Expected();
  if (!Joining()) {
    const int presumed = membership_->Presumed();
    if (presumed < 0) return kUnknownQuorum;
    members = live + presumed;
  }
  return std::max(1, members - config_.backup_workers);
}

bool Consistency::Ready(const Wait& w) const {
  switch (config_.mode) {
    case Mode::kSsp:
      return SspReady(w.request->clock());
    case Mode::kBsp:
      return store_->StepApplied(w.slices, w.request->clock());
    default:
      return true;
  }
}

bool Consistency::SspReady(int64_t clock) const {
  // Until every worker the job expects has registered once, the ones still
  // to come count as being at clock 0 (as bsp waits for them); so do, for
  // --worker_timeout after this shard restarted or was promoted, the job's
  // ranks not heard from since (their clocks died with the old process).
  const bool unknown = Joining() || membership_->Presumed() != 0;
  const int64_t slowest = unknown ? 0 : membership_->MinLiveClock();
  return clock - slowest <= config_.staleness;
}

bool Consistency::MustPushAgain(const Wait& w) const {
  return config_.mode == Mode::kBsp && w.request->after_push() &&
         store_->LacksGradient(w.slices, w.request->rank(), w.request->clock());
}

absl::Status Consistency::CheckServing() {
  if (replication_ != nullptr) RETURN_IF_ERROR(replication_->CheckServing());
  return CheckRestored();
}

absl::Status Consistency::CheckRestored() {
  if (!awaiting_fast_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&restore_mu_);
  if (!awaiting_) return absl::OkStatus();
  if (clock_->Now() < await_until_) {
    return absl::UnavailableError(absl::StrCat(
        "shard ", store_->shard(),
        " lost its model at a restart and awaits a worker's copy of its "
        "weights"));
  }
  awaiting_ = false;
  awaiting_fast_ = false;
  LOG(WARNING) << "shard " << store_->shard()
               << ": no worker sent its copy of the lost model within "
                  "--restore_wait; serving the initial weights";
  return absl::OkStatus();
}

bool Consistency::AwaitingRestore() { return !CheckRestored().ok(); }

void Consistency::Pause(int64_t until_step, absl::Duration lease) {
  absl::MutexLock lock(&pause_mu_);
  paused_ = true;
  paused_fast_ = true;
  pause_until_step_ = until_step;
  pause_until_ = clock_->Now() + lease;
}

void Consistency::Resume() {
  absl::MutexLock lock(&pause_mu_);
  paused_ = false;
  paused_fast_ = false;
}

absl::Status Consistency::CheckPaused(const v1::PushRequest& push) {
  if (!paused_fast_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&pause_mu_);
  if (!paused_) return absl::OkStatus();
  if (clock_->Now() >= pause_until_) {
    paused_ = false;
    paused_fast_ = false;
    LOG(WARNING) << "shard " << store_->shard()
                 << ": the job checkpoint's pause outlived its lease; "
                    "applying pushes again";
    return absl::OkStatus();
  }
  if (config_.mode == Mode::kBsp && push.clock() <= pause_until_step_) {
    return absl::OkStatus();  // Completes the step every shard finishes.
  }
  return absl::UnavailableError(absl::StrCat(
      "shard ", store_->shard(), " is paused for a job checkpoint"));
}

absl::Status Consistency::CheckOuterOptimizer(
    const v1::OptimizerSpec& optimizer) const {
  if (!IsOuterOptimizer(optimizer)) return absl::OkStatus();
  const std::string kind =
      absl::AsciiStrToLower(v1::OptimizerSpec::Kind_Name(optimizer.kind()));
  if (config_.mode == Mode::kBsp || config_.mode == Mode::kAllreduce) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", kind,
        " is an asynchronous outer optimizer (async, ssp); "
        "--mode=",
        ModeName(config_.mode),
        config_.mode == Mode::kBsp
            ? " takes momentum with nesterov for synchronous DiLoCo "
              "(docs/MODES.md \"Outer optimizers\")"
            : " keeps no weights on the servers to apply it to"));
  }
  if (config_.stale.kind == StalePolicy::kCompensate ||
      (optimizer.kind() == v1::OptimizerSpec::ELASTIC &&
       config_.stale.kind != StalePolicy::kNone)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer ", kind, " with --stale_policy=",
        config_.stale.kind == StalePolicy::kCompensate ? "dc"
        : config_.stale.kind == StalePolicy::kScale    ? "scale"
                                                       : "drop",
        optimizer.kind() == v1::OptimizerSpec::ELASTIC
            ? ": the worker takes its share of EASGD's step at the moving "
              "rate declared, so the server must apply it unchanged"
            : ": delay compensation is for gradients, not pseudo-gradients"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::DeclareModelResponse> Consistency::Declare(
    const v1::DeclareModelRequest& request) {
  RETURN_IF_ERROR(CheckOuterOptimizer(request.spec().optimizer()));
  if (replication_ != nullptr) RETURN_IF_ERROR(replication_->CheckServing());
  ASSIGN_OR_RETURN(v1::DeclareModelResponse r,
                   replication_ != nullptr ? replication_->Declare(request)
                                           : store_->Declare(request.spec()));
  // A shard holding no slice of the model gets no weights: nothing to wait
  // for (it reported itself awaiting a restore for --restore_wait).
  if (r.created() && (request.weights_follow() || request.recover()) &&
      store_->num_slices() > 0) {
    absl::MutexLock lock(&restore_mu_);
    awaiting_ = true;
    awaiting_initial_ = request.weights_follow();
    awaiting_fast_ = true;
    await_until_ = clock_->Now() + config_.restore_wait;
    restored_slices_ = 0;
    const std::string wait = absl::StrCat(
        "waiting up to ", absl::FormatDuration(config_.restore_wait));
    if (request.weights_follow()) {
      LOG(INFO) << "shard " << store_->shard() << ": model '"
                << request.spec().name()
                << "' declared with its initial weights to follow; " << wait
                << " for them";
    } else {
      LOG(WARNING) << "shard " << store_->shard()
                   << " started without a checkpoint and a worker declared "
                      "model '"
                   << request.spec().name() << "' again: " << wait
                   << " for that worker's copy of the weights";
    }
  }
  return r;
}

absl::Status Consistency::Assign(const v1::AssignRequest& request) {
  if (replication_ != nullptr) RETURN_IF_ERROR(replication_->CheckServing());
  // The store's change, through the replication stream when there is one.
  auto assign = [&](bool steps_unknown) {
    if (replication_ != nullptr) {
      return replication_->Assign(request, steps_unknown);
    }
    return request.load_state() ? store_->LoadState(request)
                                : store_->Assign(request, steps_unknown);
  };
  if (request.load_state()) return assign(false);
  if (!request.restore()) {
    if (config_.mode != Mode::kAllreduce) {
      store_->CountRejected();
      return absl::FailedPreconditionError(absl::StrCat(
          "Assign replaces weights only in --mode=allreduce; this shard runs "
          "--mode=",
          ModeName(config_.mode)));
    }
    return assign(false);
  }
  absl::MutexLock lock(&restore_mu_);
  if (!awaiting_) {
    store_->CountRejected();
    return absl::FailedPreconditionError(
        "this shard awaits no restore: it did not lose its model, or a "
        "worker's copy already came");
  }
  RETURN_IF_ERROR(assign(config_.mode == Mode::kBsp));
  restored_slices_ += request.weights_size();
  if (restored_slices_ >= store_->num_slices()) {
    awaiting_ = false;
    awaiting_fast_ = false;
    int64_t newest = 0;
    for (const v1::SliceData& w : request.weights()) {
      newest = std::max(newest, w.version());
    }
    if (awaiting_initial_) {
      LOG(INFO) << "shard " << store_->shard()
                << " has the model's initial weights, from rank "
                << request.rank();
    } else {
      LOG(WARNING) << "shard " << store_->shard()
                   << " restored its lost model from rank " << request.rank()
                   << "'s copy (slice versions up to " << newest
                   << "): only the updates in flight at the crash are lost";
    }
  }
  return absl::OkStatus();
}

void Consistency::Pull(const v1::PullRequest& request,
                       v1::PullResponse* response, PendingCall call) {
  if (absl::Status serving = CheckServing(); !serving.ok()) {
    call.done(std::move(serving));
    return;
  }
  auto slices = store_->ResolvePull(request);
  if (!slices.ok()) {
    call.done(slices.status());
    return;
  }
  Wait w{&request, response, *std::move(slices), absl::InfinitePast()};
  const bool may_wait =
      (config_.mode == Mode::kSsp || config_.mode == Mode::kBsp) &&
      request.rank() >= 0;
  if (!may_wait || Ready(w)) {
    store_->FinishPull(request, w.slices, response);
    call.done(absl::OkStatus());
    return;
  }
  if (config_.mode == Mode::kBsp && request.incarnation() != 0 &&
      request.incarnation() != store_->incarnation()) {
    call.done(absl::AbortedError(absl::StrCat(
        "shard ", store_->shard(), " restarted since this worker pulled; ",
        "push step ", request.clock(), "'s gradient again, then pull")));
    return;
  }
  if (MustPushAgain(w)) {
    call.done(PushAgain(store_->shard(), request.rank(), request.clock()));
    return;
  }
  if (HoldWithin(&waiters_, std::move(w), std::move(call), "pulls")) {
    Recheck();  // The condition may have turned true meanwhile.
  }
}

absl::StatusOr<v1::RegisterResponse> Consistency::Register(
    const v1::RegisterRequest& request) {
  return replication_ != nullptr ? replication_->Register(request)
                                 : membership_->Register(request);
}

absl::Status Consistency::Heartbeat(const v1::HeartbeatRequest& request,
                                    v1::HeartbeatResponse* response) {
  RETURN_IF_ERROR(membership_->Heartbeat(request));
  response->set_fastest_steps_per_second(membership_->FastestStepsPerSecond());
  for (int r : membership_->LiveRanks()) response->add_live_ranks(r);
  response->set_start_size(membership_->StartSize());
  if (request.leaving() && replication_ != nullptr) {
    replication_->MembershipChanged();
  }
  ClockAdvanced();
  return absl::OkStatus();
}

absl::Status Consistency::Push(const v1::PushRequest& request,
                               v1::PushResponse* response) {
  if (config_.mode == Mode::kAllreduce) {
    store_->CountRejected();
    return absl::FailedPreconditionError(
        "this server runs --mode=allreduce: workers all-reduce gradients "
        "among themselves and send weights with Assign");
  }
  RETURN_IF_ERROR(CheckServing());
  RETURN_IF_ERROR(CheckPaused(request));
  const PushLedger::Verdict verdict = ledger_.Begin(request, response);
  if (verdict == PushLedger::Verdict::kAnswered) {
    store_->CountDuplicatePush();
    // Answered once the backups hold the first copy (its op may still be
    // on its way), and, if a backup dropped out of its stream, only once
    // enough members hold it (--min_insync).
    if (replication_ != nullptr) {
      RETURN_IF_ERROR(replication_->AwaitStreamed());
      RETURN_IF_ERROR(replication_->CheckInSync());
    }
    return absl::OkStatus();
  }
  if (verdict == PushLedger::Verdict::kTooOld) store_->CountRejected();
  RETURN_IF_ERROR(PushLedger::Refusal(verdict, request));
  PushPolicy policy;
  policy.mode = config_.mode;
  policy.stale = config_.stale;
  policy.live_workers = membership_->LiveCount();
  policy.quorum = Quorum(policy.live_workers);
  policy.now = clock_->Now();
  absl::Status pushed = replication_ != nullptr
                            ? replication_->Push(request, policy, response)
                            : store_->Push(request, policy, response);
  ledger_.Finish(request, pushed, *response);
  if (IsNonFinite(pushed)) membership_->NoteNonFinite(request.rank());
  RETURN_IF_ERROR(pushed);
  Recheck();
  // Applied and remembered, but held by fewer than --min_insync members (a
  // backup dropped out while it streamed): not acknowledged; the client's
  // retry is answered from the ledger once a backup joined.
  if (replication_ != nullptr) RETURN_IF_ERROR(replication_->CheckInSync());
  if (config_.lose_every_nth_answer > 0 &&
      (pushes_seen_.fetch_add(1) + 1) % config_.lose_every_nth_answer == 0) {
    return absl::UnavailableError("answer lost on the way (test hook)");
  }
  return absl::OkStatus();
}

void Consistency::PushPull(const v1::PushPullRequest& request,
                           v1::PushPullResponse* response, PendingCall call) {
  const v1::PushRequest& push = request.push();
  absl::Status pushed = Push(push, response->mutable_push());
  if (!pushed.ok()) {
    call.done(std::move(pushed));
    return;
  }
  // The pull half: the same slices, answered now or held (ssp, bsp). The
  // request lives until the call is answered.
  auto pull = std::make_shared<v1::PullRequest>();
  pull->set_rank(push.rank());
  pull->set_clock(push.clock());
  pull->set_dtype(request.weights_dtype());
  pull->set_after_push(true);
  for (const v1::SliceData& g : push.gradients()) {
    *pull->add_slices() = g.key();
  }
  call.done = [finish = std::move(call.done), pull](absl::Status s) {
    finish(std::move(s));
  };
  Pull(*pull, response->mutable_pull(), std::move(call));
}

}  // namespace asyncps
