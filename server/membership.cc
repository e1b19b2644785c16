#include "server/membership.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/random_id.h"
#include "common/status_macros.h"

namespace asyncps {

Membership::Membership(Clock* clock, absl::Duration worker_timeout,
                       Resume resume, int job_workers,
                       absl::Duration rejoin_grace, bool elastic)
    : clock_(clock),
      worker_timeout_(worker_timeout),
      resume_(resume),
      job_workers_(job_workers),
      rejoin_grace_(rejoin_grace),
      elastic_(elastic),
      started_(clock->Now()),
      expected_(job_workers) {}

bool Membership::Live(const Worker& w, absl::Time now) const {
  return !w.left && now - w.last_heard <= worker_timeout_;
}

absl::StatusOr<int> Membership::RankFor(const v1::RegisterRequest& request,
                                        absl::Time now) const {
  int rank = request.rank();
  if (rank == -1) {
    rank = 0;
    for (auto it = workers_.find(rank);
         it != workers_.end() && Live(it->second, now);
         it = workers_.find(rank)) {
      ++rank;
    }
    if (rank >= RankLimit(request)) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "every rank of the job's ", RankLimit(request),
          " is live; a worker asking for one (rank -1) gets the first that "
          "is not (after --worker_timeout without heartbeats)"));
    }
  }
  return rank;
}

absl::Status Membership::CheckRegister(
    const v1::RegisterRequest& request) const {
  if (request.num_workers() < 1 || request.num_workers() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers ", request.num_workers(), " is outside [1, ",
                     kMaxRank, "]"));
  }
  const int ranks = RankLimit(request);
  if (request.rank() < -1 || request.rank() >= ranks) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", request.rank(), " is outside [-1, ",
                     elastic_ ? "kMaxRank " : "num_workers ", ranks, ")"));
  }
  if (request.clock() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("clock ", request.clock(), " is negative"));
  }
  if (request.known_live_size() > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("known_live lists ", request.known_live_size(),
                     " ranks, more than ", kMaxRank));
  }
  for (int r : request.known_live()) {
    if (r < 0 || r >= kMaxRank) {
      return absl::InvalidArgumentError(absl::StrCat(
          "known_live has rank ", r, ", outside [0, ", kMaxRank, ")"));
    }
  }
  if (!elastic_ && job_workers_ > 0 && request.num_workers() != job_workers_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker says the job has num_workers ", request.num_workers(),
        " but the server was started with --num_workers=", job_workers_));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::RegisterResponse> Membership::Register(
    const v1::RegisterRequest& request) {
  RETURN_IF_ERROR(CheckRegister(request));
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (request.rank() >= 0) {
    auto it = workers_.find(request.rank());
    if (it != workers_.end() && Live(it->second, now) &&
        request.secret() != it->second.secret) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", request.rank(), " is held by a live worker (heard from ",
          absl::FormatDuration(now - it->second.last_heard),
          " ago); another may take it once that one has been silent for "
          "--worker_timeout=",
          absl::FormatDuration(worker_timeout_), " or has left"));
    }
  }
  if (elastic_ && expected_ == 0) {
    expected_ = request.num_workers();  // How many a bsp start waits for.
    expected_from_rank_ = request.rank();
  } else if (!elastic_ && request.num_workers() != expected_) {
    for (const auto& [r, w] : workers_) {
      if (!Live(w, now) || r == request.rank()) continue;
      return absl::FailedPreconditionError(absl::StrCat(
          "this worker says the job has num_workers ", request.num_workers(),
          " but live rank ", r, " joined it with ", expected_, " (rank ",
          expected_from_rank_,
          " set it); start every worker with the same --num_workers"));
    }
    expected_ = request.num_workers();
    expected_from_rank_ = request.rank();
  }
  if (elastic_ && presumed_ranks_.empty() && request.known_live_size() > 0 &&
      now - started_ < worker_timeout_) {
    presumed_ranks_.assign(request.known_live().begin(),
                           request.known_live().end());
    std::sort(presumed_ranks_.begin(), presumed_ranks_.end());
    presumed_ranks_.erase(
        std::unique(presumed_ranks_.begin(), presumed_ranks_.end()),
        presumed_ranks_.end());
  }
  ASSIGN_OR_RETURN(const int rank, RankFor(request, now));
  Worker& w = workers_[rank];
  const bool known = w.incarnation != 0;
  w.incarnation = next_incarnation_++;
  w.secret = RandomId();
  w.left = false;
  w.last_heard = now;
  w.host = request.host().substr(0, 256);
  v1::RegisterResponse response;
  response.set_rank(rank);
  response.set_incarnation(w.incarnation);
  response.set_secret(w.secret);
  NoteClock(request.clock());
  const int64_t resume = ResumeFor(request, rank, known ? w.clock : 0, now);
  w.first_step = elastic_ && resume_ == Resume::kJobFront
                     ? std::max(resume, request.clock()) + 1
                     : 0;
  w.clock = std::max(resume, request.clock());
  w.done = w.clock;  // It starts after `resume`: it sends none of those.
  w.reported_nonfinite = 0;  // A new process counts from 0.
  response.set_attempt(++w.attempt);
  response.set_resume_clock(resume);
  response.set_elastic(elastic_);
  response.set_start_size(StartSizeLocked());
  for (int r : LiveRanksLocked(now)) response.add_live_ranks(r);
  return response;
}

int64_t Membership::ResumeFor(const v1::RegisterRequest& request, int rank,
                              int64_t own, absl::Time now) const {
  // A replacement in async or ssp goes on from where its rank stopped; in
  // an elastic job not behind the slowest live worker, whom ssp would hold.
  if (resume_ == Resume::kOwnClock) {
    const int64_t resume = std::max(own, request.clock());
    if (!elastic_) return resume;
    return std::max(resume, MinLiveClockLocked(now, rank).value_or(0));
  }
  // A worker joining an elastic job starts at the front and sends the next
  // step; one re-registering (a shard restarted) goes on where it says.
  if (elastic_) return request.clock() > 0 ? request.clock() : max_clock_;
  // A (re)joining worker starts where the job is, not at 0: one step
  // behind the front, so in bsp its first gradient completes the step the
  // others are in (or is dropped as late where that step is done).
  // A worker that says where it is (re-registering after a shard restart,
  // or an allreduce survivor re-forming the ring) moves the job's front
  // first, so a replacement registering next gets the same resume clock.
  return std::max<int64_t>(0, max_clock_ - 1);
}

absl::Status Membership::Heartbeat(const v1::HeartbeatRequest& request) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(request.rank());
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "rank ", request.rank(), " has not registered; call Register first"));
  }
  if (request.incarnation() != it->second.incarnation) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", request.rank(), " incarnation ", request.incarnation(),
        " was superseded by incarnation ", it->second.incarnation));
  }
  if (request.secret() != it->second.secret) {
    return absl::PermissionDeniedError(
        absl::StrCat("heartbeat of rank ", request.rank(),
                     " without its registration's secret"));
  }
  it->second.last_heard = clock_->Now();
  it->second.clock = std::max(it->second.clock, request.clock());
  it->second.done = std::max(it->second.done, request.clock());
  it->second.left = request.leaving();
  if (request.has_progress()) {
    it->second.progress = request.progress();
    const int64_t more =
        request.progress().nonfinite_pushes() - it->second.reported_nonfinite;
    if (more > 0) {
      it->second.nonfinite += more;
      it->second.reported_nonfinite = request.progress().nonfinite_pushes();
      it->second.last_nonfinite = it->second.last_heard;
    }
  }
  NoteClock(request.clock());
  UpdateGap(it->second.last_heard);
  return absl::OkStatus();
}

double Membership::FastestStepsPerSecond() const {
  absl::MutexLock lock(&mu_);
  const absl::Time now = clock_->Now();
  double fastest = 0;
  for (const auto& [rank, w] : workers_) {
    if (Live(w, now) && !w.left) {
      fastest = std::max(fastest, w.progress.steps_per_second());
    }
  }
  return fastest;
}

absl::Status Membership::Authorize(int rank, uint64_t secret, int64_t clock,
                                   bool anyone) {
  if (rank < 0) {
    if (anyone) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", rank, ": only a registered worker (rank >= 0) may do this"));
  }
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(rank);
  if (it == workers_.end()) {
    // A shard that has just (re)started knows no one yet: the job's
    // workers go on as before while their heartbeats register them again.
    if (clock_->Now() - started_ < rejoin_grace_) return absl::OkStatus();
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank,
        " has not registered with this shard (it may have restarted: the "
        "worker's heartbeats register it again)"));
  }
  if (secret != it->second.secret) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the call acts as rank ", rank,
        " without the secret of that rank's registration (another worker "
        "holds the rank, or this one was replaced)"));
  }
  TouchLocked(&it->second, clock);
  return absl::OkStatus();
}

void Membership::Touch(int rank, int64_t clock) {
  if (rank < 0) return;
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(rank);
  if (it == workers_.end()) return;
  TouchLocked(&it->second, clock);
}

void Membership::TouchLocked(Worker* w, int64_t clock) {
  w->last_heard = clock_->Now();
  w->clock = std::max(w->clock, clock);
  NoteClock(clock);
  UpdateGap(w->last_heard);
}

void Membership::NoteClock(int64_t clock) {
  if (clock <= max_clock_) return;
  max_clock_ = clock;
  for (auto& [rank, w] : workers_) w.attempt = 0;
}

void Membership::UpdateGap(absl::Time now) {
  bool any = false;
  int64_t lo = 0, hi = 0;
  for (const auto& [rank, w] : workers_) {
    if (!Live(w, now)) continue;
    lo = any ? std::min(lo, w.clock) : w.clock;
    hi = any ? std::max(hi, w.clock) : w.clock;
    any = true;
  }
  max_gap_ = std::max(max_gap_, hi - lo);
}

int64_t Membership::MaxClockGap() const {
  absl::MutexLock lock(&mu_);
  return max_gap_;
}

void Membership::NoteNonFinite(int rank) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(rank);
  if (it == workers_.end()) return;
  ++it->second.nonfinite;
  it->second.last_nonfinite = now;
}

std::vector<v1::WorkerInfo> Membership::Workers() const {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> out;
  for (const auto& [rank, w] : workers_) {
    v1::WorkerInfo info;
    info.set_rank(rank);
    info.set_incarnation(w.incarnation);
    info.set_clock(w.clock);
    info.set_seconds_since_heard(absl::ToDoubleSeconds(now - w.last_heard));
    info.set_last_seen_timestamp_seconds(
        absl::ToDoubleSeconds(w.last_heard - absl::UnixEpoch()));
    info.set_live(Live(w, now));
    info.set_finished(w.left);
    info.set_host(w.host);
    *info.mutable_progress() = w.progress;
    info.set_nonfinite_pushes(w.nonfinite);
    info.set_seconds_since_nonfinite(
        w.nonfinite > 0 ? absl::ToDoubleSeconds(now - w.last_nonfinite) : -1);
    out.push_back(std::move(info));
  }
  return out;
}

}  // namespace asyncps
