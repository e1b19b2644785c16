// What the rest of the shard reads of the membership: who is live, the
// job's size and front, and its state as replication streams it.
#include <algorithm>

#include "server/membership.h"

namespace asyncps {

int Membership::LiveCount() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  // A worker that joined an elastic job at front M sends step M + 1 first;
  // the step in progress (M, or 1 before any) goes without it.
  const int64_t front = std::max<int64_t>(max_clock_, 1);
  int n = 0;
  for (const auto& [rank, w] : workers_) {
    n += Live(w, now) && (!elastic_ || w.first_step <= front);
  }
  return n;
}

std::vector<int> Membership::LiveRanks() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  return LiveRanksLocked(now);
}

int Membership::StartSize() const {
  absl::MutexLock lock(&mu_);
  return StartSizeLocked();
}

int Membership::StartSizeLocked() const {
  for (int rank = 0; rank < expected_; ++rank) {
    if (workers_.find(rank) == workers_.end()) return expected_;
  }
  return 0;
}

std::vector<int> Membership::LiveRanksLocked(absl::Time now) const {
  std::vector<int> ranks;
  for (const auto& [rank, w] : workers_) {
    if (Live(w, now)) ranks.push_back(rank);  // std::map: ascending.
  }
  return ranks;
}

int Membership::Presumed() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (now - started_ >= worker_timeout_) return 0;
  if (expected_ <= 0) return -1;
  auto presumed = [&](int rank) ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    const auto it = workers_.find(rank);
    return it == workers_.end() ||
           (!Live(it->second, now) && !it->second.left &&
            it->second.last_heard < started_);
  };
  int n = 0;
  if (!presumed_ranks_.empty()) {
    for (int rank : presumed_ranks_) n += presumed(rank);
    return n;
  }
  for (int rank = 0; rank < expected_; ++rank) n += presumed(rank);
  return n;
}

void Membership::Restarted() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  started_ = now;
  presumed_ranks_.clear();
}

v1::MembershipState Membership::Export() const {
  absl::MutexLock lock(&mu_);
  v1::MembershipState state;
  for (const auto& [rank, w] : workers_) {
    v1::MembershipState::Worker* out = state.add_workers();
    out->set_rank(rank);
    out->set_incarnation(w.incarnation);
    out->set_secret(w.secret);
    out->set_clock(w.clock);
    out->set_left(w.left);
    out->set_host(w.host);
    out->set_attempt(w.attempt);
    out->set_first_step(w.first_step);
  }
  state.set_next_incarnation(next_incarnation_);
  state.set_expected(expected_);
  state.set_expected_from_rank(expected_from_rank_);
  state.set_max_clock(max_clock_);
  return state;
}

void Membership::Import(const v1::MembershipState& state) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  workers_.clear();
  for (const v1::MembershipState::Worker& in : state.workers()) {
    Worker& w = workers_[in.rank()];
    w.incarnation = in.incarnation();
    w.secret = in.secret();
    w.clock = in.clock();
    w.left = in.left();
    w.host = in.host();
    w.attempt = in.attempt();
    w.first_step = in.first_step();
    w.last_heard = now;
  }
  next_incarnation_ = std::max<int64_t>(state.next_incarnation(), 1);
  expected_ = state.expected();
  expected_from_rank_ = state.expected_from_rank();
  max_clock_ = state.max_clock();
}

void Membership::NoteJobFront(int64_t clock) {
  absl::MutexLock lock(&mu_);
  NoteClock(clock);
}

int64_t Membership::MinLiveClock() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  return MinLiveClockLocked(now).value_or(0);
}

std::optional<int64_t> Membership::MinLiveClockLocked(absl::Time now,
                                                      int except) const {
  std::optional<int64_t> min;
  for (const auto& [rank, w] : workers_) {
    if (rank == except || !Live(w, now)) continue;
    min = std::min(min.value_or(w.clock), w.clock);
  }
  return min;
}

int Membership::Expected() const {
  absl::MutexLock lock(&mu_);
  return expected_;
}

bool Membership::AllFinished() const {
  absl::MutexLock lock(&mu_);
  if (expected_ <= 0) return false;
  for (int rank = 0; rank < expected_; ++rank) {
    const auto it = workers_.find(rank);
    if (it == workers_.end() || !it->second.left) return false;
  }
  // An elastic job is not done while a worker that joined still trains.
  return !elastic_ || LiveRanksLocked(clock_->Now()).empty();
}

int Membership::Registered() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(workers_.size());
}

int64_t Membership::MaxClock() const {
  absl::MutexLock lock(&mu_);
  return max_clock_;
}

absl::flat_hash_map<int, int64_t> Membership::DoneSteps() const {
  absl::MutexLock lock(&mu_);
  absl::flat_hash_map<int, int64_t> done;
  for (const auto& [rank, w] : workers_) done[rank] = w.done;
  return done;
}

std::vector<Membership::LivenessChange> Membership::LivenessChanges() {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<LivenessChange> changes;
  for (auto& [rank, w] : workers_) {
    const bool live = Live(w, now);
    if (live != w.was_live) changes.push_back({rank, live, w.left});
    w.was_live = live;
  }
  return changes;
}

}  // namespace asyncps
