#include "server/consistency.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "common/status.h"
#include "glog/logging.h"

namespace asyncps {

Consistency::Consistency(ConsistencyConfig config, ShardStore* store,
                         Membership* membership, Clock* clock)
    : config_(config),
      store_(store),
      membership_(membership),
      clock_(clock),
      ticker_([this] { TickLoop(); }) {}

Consistency::~Consistency() { Shutdown(); }

void Consistency::Shutdown() {
  std::vector<Waiter> held;
  {
    absl::MutexLock lock(&mu_);
    if (shut_down_) return;
    shut_down_ = true;
    held.swap(waiters_);
  }
  for (Waiter& w : held) {
    w.reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
  }
  stop_.Notify();
  ticker_.join();
}

int Consistency::Quorum(int live) const {
  // Until every worker the job expects has registered once, a step waits
  // for all of them (as Horovod's first collective does); afterwards for
  // the live ones.
  const int expected = membership_->Expected();
  const int members = membership_->Registered() < expected ? expected : live;
  return std::max(1, members - config_.backup_workers);
}

bool Consistency::Ready(const Waiter& w) const {
  switch (config_.mode) {
    case Mode::kSsp:
      return w.request->clock() - membership_->MinLiveClock() <=
             config_.staleness;
    case Mode::kBsp:
      return store_->StepApplied(w.slices, w.request->clock());
    default:
      return true;
  }
}

void Consistency::Pull(grpc::CallbackServerContext* context,
                       const v1::PullRequest* request,
                       v1::PullResponse* response,
                       grpc::ServerUnaryReactor* reactor) {
  auto slices = store_->ResolvePull(*request);
  if (!slices.ok()) {
    reactor->Finish(ToGrpcStatus(slices.status()));
    return;
  }
  Waiter w{context, request, response, reactor, *std::move(slices)};
  const bool may_wait =
      (config_.mode == Mode::kSsp || config_.mode == Mode::kBsp) &&
      request->rank() >= 0;
  if (!may_wait || Ready(w)) {
    store_->FinishPull(*request, w.slices, response);
    reactor->Finish(grpc::Status::OK);
    return;
  }
  held_total_.fetch_add(1);
  {
    absl::MutexLock lock(&mu_);
    if (!shut_down_) {
      waiters_.push_back(std::move(w));
      w.reactor = nullptr;
    }
  }
  if (w.reactor != nullptr) {
    reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
    return;
  }
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
  absl::Status s = store_->Push(request, policy, response);
  if (s.ok()) Recheck();
  return s;
}

void Consistency::Recheck() {
  std::vector<Waiter> ready, expired;
  {
    absl::MutexLock lock(&mu_);
    if (waiters_.empty()) return;
    const auto now = std::chrono::system_clock::now();
    std::vector<Waiter> keep;
    for (Waiter& w : waiters_) {
      if (Ready(w)) {
        ready.push_back(std::move(w));
      } else if (w.context->deadline() < now || w.context->IsCancelled()) {
        expired.push_back(std::move(w));
      } else {
        keep.push_back(std::move(w));
      }
    }
    waiters_.swap(keep);
  }
  for (Waiter& w : ready) {
    store_->FinishPull(*w.request, w.slices, w.response);
    w.reactor->Finish(grpc::Status::OK);
  }
  for (Waiter& w : expired) {
    w.reactor->Finish(grpc::Status(
        grpc::StatusCode::DEADLINE_EXCEEDED,
        config_.mode == Mode::kSsp
            ? "pull held past its deadline: the slowest live worker is too "
              "far behind"
            : "pull held past its deadline: the step was not applied"));
  }
}

void Consistency::AddTickHook(std::function<void(absl::Time)> hook) {
  absl::MutexLock lock(&mu_);
  hooks_.push_back(std::move(hook));
}

void Consistency::TickLoop() {
  // The ticker is the server's own housekeeping period, not a way of
  // waiting for another process.
  while (!stop_.WaitForNotificationWithTimeout(config_.tick)) {
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
    const absl::Time now = clock_->Now();
    if (config_.mode == Mode::kBsp) {
      const int live = membership_->LiveCount();
      store_->CompletePendingSteps(Quorum(live), live, config_.step_deadline,
                                   now);
    }
    Recheck();
    std::vector<std::function<void(absl::Time)>> hooks;
    {
      absl::MutexLock lock(&mu_);
      hooks = hooks_;
    }
    for (auto& h : hooks) h(now);
  }
}

}  // namespace asyncps
