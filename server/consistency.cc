#include "server/consistency.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "common/status.h"
#include "glog/logging.h"

namespace asyncps {

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
  return absl::OkStatus();
}

Consistency::Consistency(ConsistencyConfig config, ShardStore* store,
                         Membership* membership, Clock* clock)
    : config_(config), store_(store), membership_(membership), clock_(clock) {}

void Consistency::Shutdown() { waiters_.Close(); }

int Consistency::Quorum(int live) const {
  // Until every worker the job expects has registered once, a step waits
  // for all of them (as Horovod's first collective does); afterwards for
  // the live ones.
  const int expected = membership_->Expected();
  const int members = membership_->Registered() < expected ? expected : live;
  return std::max(1, members - config_.backup_workers);
}

bool Consistency::Ready(const Wait& w) const {
  switch (config_.mode) {
    case Mode::kSsp: {
      // Until every worker the job expects has registered once, the ones
      // still to come count as being at clock 0 (as bsp waits for them).
      const int64_t slowest =
          membership_->Registered() < membership_->Expected()
              ? 0
              : membership_->MinLiveClock();
      return w.request->clock() - slowest <= config_.staleness;
    }
    case Mode::kBsp:
      return store_->StepApplied(w.slices, w.request->clock());
    default:
      return true;
  }
}

void Consistency::Pull(const v1::PullRequest& request,
                       v1::PullResponse* response, PendingCall call) {
  auto slices = store_->ResolvePull(request);
  if (!slices.ok()) {
    call.done(slices.status());
    return;
  }
  Wait w{&request, response, *std::move(slices)};
  const bool may_wait =
      (config_.mode == Mode::kSsp || config_.mode == Mode::kBsp) &&
      request.rank() >= 0;
  if (!may_wait || Ready(w)) {
    store_->FinishPull(request, w.slices, response);
    call.done(absl::OkStatus());
    return;
  }
  held_total_.fetch_add(1);
  waiters_.Hold({std::move(w), std::move(call)});
  Recheck();  // The condition may have turned true meanwhile.
}

absl::Status Consistency::Push(const v1::PushRequest& request,
                               v1::PushResponse* response) {
  if (config_.mode == Mode::kAllreduce) {
    store_->CountRejected();
    return absl::FailedPreconditionError(
        "this server runs --mode=allreduce: workers all-reduce gradients "
        "among themselves and send weights with Assign");
  }
  PushPolicy policy;
  policy.mode = config_.mode;
  policy.stale = config_.stale;
  policy.live_workers = membership_->LiveCount();
  policy.quorum = Quorum(policy.live_workers);
  policy.now = clock_->Now();
  RETURN_IF_ERROR(store_->Push(request, policy, response));
  Recheck();
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
  for (const v1::SliceData& g : push.gradients()) {
    *pull->add_slices() = g.key();
  }
  call.done = [finish = std::move(call.done), pull](absl::Status s) {
    finish(std::move(s));
  };
  Pull(*pull, response->mutable_pull(), std::move(call));
}

void Consistency::Recheck() {
  std::vector<HeldCalls<Wait>::Held> ready, expired;
  waiters_.Sweep(
      clock_->Now(), [this](const Wait& w) { return Ready(w); }, &ready,
      &expired);
  for (auto& h : ready) {
    store_->FinishPull(*h.what.request, h.what.slices, h.what.response);
    h.call.done(absl::OkStatus());
  }
  for (auto& h : expired) {
    h.call.done(absl::DeadlineExceededError(
        config_.mode == Mode::kSsp
            ? "pull held past its deadline: the slowest live worker is too "
              "far behind"
            : "pull held past its deadline: the step was not applied"));
  }
}

void Consistency::Tick() {
  for (const auto& change : membership_->LivenessChanges()) {
    const int rank = change.rank;
    if (change.live) {
      LOG(INFO) << "rank " << rank << " is live";
    } else if (change.left) {
      LOG(INFO) << "rank " << rank << " is done and left";
    } else {
      LOG(WARNING) << "rank " << rank << " silent for longer than "
                   << "--worker_timeout: dropped from "
                   << ModeName(config_.mode) << " waits";
    }
  }
  if (config_.mode == Mode::kBsp) {
    const int live = membership_->LiveCount();
    store_->CompletePendingSteps(Quorum(live), live, config_.step_deadline,
                                 clock_->Now());
  }
  Recheck();
}

}  // namespace asyncps
