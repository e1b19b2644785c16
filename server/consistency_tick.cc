// Consistency's periodic side (server/consistency.h), run by Tick: the
// held pulls rechecked (answered, expired, or told to push again), bsp's
// steps advanced and healed past workers that left, and a stall diagnosed
// for the log and Stats. The calls' side is in consistency.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "glog/logging.h"
#include "server/consistency.h"
#include "server/rows.h"

namespace asyncps {

Consistency::Oldest Consistency::Recheck(absl::flat_hash_set<int>* stuck,
                                         HeldByRank* held) {
  std::vector<HeldCalls<Wait>::Held> ready, expired;
  Oldest oldest;
  const absl::Time now = clock_->Now();
  waiters_.Sweep(
      now,
      [this, &oldest, stuck, held](const Wait& w) {
        if (Ready(w) || MustPushAgain(w)) return true;
        if (w.since < oldest.since) {
          oldest = {w.request->rank(), w.request->clock(), w.since};
        }
        if (stuck != nullptr) stuck->insert(w.request->rank());
        if (held != nullptr) {
          auto [it, first] = held->try_emplace(
              w.request->rank(), HeldSince{w.request->clock(), w.since});
          if (!first) {
            it->second.clock = std::min(it->second.clock, w.request->clock());
            it->second.since = std::min(it->second.since, w.since);
          }
        }
        return false;
      },
      &ready, &expired);
  for (auto& h : ready) {
    if (!Ready(h.what)) {  // MustPushAgain.
      h.call.done(PushAgain(store_->shard(), h.what.request->rank(),
                            h.what.request->clock()));
      continue;
    }
    store_->FinishPull(*h.what.request, h.what.slices, h.what.response);
    if (config_.observer != nullptr) {
      config_.observer->HeldPullAnswered(h.what.request->rank(),
                                         now - h.what.since);
    }
    h.call.done(absl::OkStatus());
  }
  for (auto& h : expired) {
    h.call.done(absl::DeadlineExceededError(
        config_.mode == Mode::kSsp
            ? "pull held past its deadline: the slowest live worker is too "
              "far behind"
            : "pull held past its deadline: the step was not applied"));
  }
  RecheckRows(now, stuck);
  return oldest;
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
  // A replicated shard's backup changes nothing by itself: its primary
  // streams what it did (Replication::AdvanceSteps).
  if (config_.mode == Mode::kBsp && ReplicaServing().ok()) AdvanceSteps();
  DiagnoseStall(Recheck());
}

void Consistency::AdvanceSteps() {
  // The highest clock a worker reported (a step it pushes or pulls, or the
  // steps it completed) says the job completed the step before it on every
  // slice. A shard restored from an older checkpoint is behind that, and
  // its slices would hold pulls of those steps for gradients nobody sends
  // again (each worker has the step's weights already).
  ShardStore::StepAdvance advance;
  advance.fast_forward_to = membership_->MaxClock() - 1;
  const int live = membership_->LiveCount();
  const absl::Time now = clock_->Now();
  advance.quorum = Quorum(live);
  advance.live_workers = live;
  advance.deadline = config_.step_deadline;
  advance.now = now;
  NotSending not_sending;
  std::vector<int> live_ranks;
  int64_t skip = -1;
  if (config_.heal_after > absl::ZeroDuration()) {
    HeldByRank held;
    Recheck(&not_sending.stuck, &held);
    not_sending.done = membership_->DoneSteps();
    for (const v1::WorkerInfo& w : membership_->Workers()) {
      if (w.live()) live_ranks.push_back(w.rank());
    }
    skip = StepNobodySends(live_ranks, held, now);
    if (skip <= advance.fast_forward_to) skip = -1;  // Completed anyway.
    advance.fast_forward_to = std::max(advance.fast_forward_to, skip);
    advance.heal = true;
    advance.live_ranks = live_ranks;
    advance.not_sending = std::move(not_sending);
    advance.heal_after = config_.heal_after;
  }
  // A replicated shard's backups do the same, in the primary's order.
  const ShardStore::StepsAdvanced done =
      replication_ != nullptr ? replication_->AdvanceSteps(advance)
                              : AdvanceShardSteps(store_, tables_, advance);
  if (done.moved > 0 && skip >= 0) {
    LOG(WARNING) << "shard " << store_->shard() << ": " << done.moved
                 << " slice(s) skipped to step " << skip
                 << ": every live rank has waited "
                 << absl::FormatDuration(config_.heal_after)
                 << " or more for it, and none will send its gradient (each "
                    "lost it with a restart)";
  } else if (done.moved > 0) {
    LOG(WARNING) << "shard " << store_->shard() << ": " << done.moved
                 << " slice(s) behind step " << advance.fast_forward_to
                 << ", which the job has completed (restored from an older "
                    "checkpoint), caught up to it";
  }
  for (const std::string& h : done.healed) {
    LOG(WARNING) << "shard " << store_->shard() << ": applied " << h
                 << ": its gradient had not come after "
                 << absl::FormatDuration(config_.heal_after)
                 << " and every rank missing from it waits for the step or "
                    "said it completed it (its share was lost)";
  }
}

int64_t Consistency::StepNobodySends(const std::vector<int>& live_ranks,
                                     const HeldByRank& held,
                                     absl::Time now) const {
  if (live_ranks.empty()) return -1;
  int64_t step = -1;
  for (int rank : live_ranks) {
    auto it = held.find(rank);
    if (it == held.end() || now - it->second.since < config_.heal_after) {
      return -1;
    }
    step = step < 0 ? it->second.clock : std::min(step, it->second.clock);
  }
  return step;
}

void Consistency::DiagnoseStall(const Oldest& oldest) {
  const absl::Time now = clock_->Now();
  {
    absl::MutexLock lock(&stall_mu_);
    oldest_held_ = oldest.since == absl::InfiniteFuture() ? absl::ZeroDuration()
                                                          : now - oldest.since;
  }
  if (config_.stall_warn <= absl::ZeroDuration() ||
      oldest.since == absl::InfiniteFuture() ||
      now - oldest.since < config_.stall_warn) {
    absl::MutexLock lock(&stall_mu_);
    stall_.clear();
    return;
  }
  // ssp waits for workers more than `staleness` clocks behind the puller;
  // bsp for those that have not completed the puller's step before it.
  const int64_t needed = config_.mode == Mode::kSsp
                             ? oldest.clock - config_.staleness
                             : oldest.clock;
  std::string whom;
  for (const v1::WorkerInfo& w : membership_->Workers()) {
    if (w.rank() == oldest.rank || w.clock() >= needed) continue;
    absl::StrAppend(&whom, whom.empty() ? "" : ", ", "rank ", w.rank(),
                    " (clock ", w.clock(), ", last seen ",
                    absl::FormatDuration(absl::Seconds(
                        static_cast<int64_t>(w.seconds_since_heard()))),
                    " ago", w.live() ? "" : ", not live", ")");
  }
  const int expected = membership_->Expected();
  const int registered = membership_->Registered();
  if (Joining()) {
    absl::StrAppend(&whom, whom.empty() ? "" : ", ", expected - registered,
                    " worker(s) not yet registered");
  }
  if (whom.empty()) whom = "no rank behind it (a step short of gradients)";
  const std::string stall = absl::StrCat(
      ModeName(config_.mode), " pull of rank ", oldest.rank, " at clock ",
      oldest.clock, " held for ",
      absl::FormatDuration(absl::Seconds(
          static_cast<int64_t>(absl::ToDoubleSeconds(now - oldest.since)))),
      ", waiting for ", whom);
  absl::MutexLock lock(&stall_mu_);
  stall_ = stall;
  if (warned_ != std::make_pair(oldest.rank, oldest.clock)) {
    warned_ = {oldest.rank, oldest.clock};
    LOG(WARNING) << "stalled: " << stall;
  }
}

std::string Consistency::Stall() {
  absl::MutexLock lock(&stall_mu_);
  return stall_;
}

absl::Duration Consistency::OldestHeld() {
  absl::MutexLock lock(&stall_mu_);
  return oldest_held_;
}

}  // namespace asyncps
