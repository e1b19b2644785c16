#include "worker/elastic_ring.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "glog/logging.h"

namespace asyncps {
namespace {

// How long each look at the store for the next ring's members waits before
// this rank looks whether it is the one to write them.
constexpr absl::Duration kPoll = absl::Milliseconds(50);

bool Has(const std::vector<int>& ranks, int r) {
  return std::find(ranks.begin(), ranks.end(), r) != ranks.end();
}

// "3,5,8" as ranks; empty on anything else.
std::vector<int> ParseRanks(const std::string& s) {
  std::vector<int> ranks;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int r = 0;
    if (!absl::SimpleAtoi(part, &r)) return {};
    ranks.push_back(r);
  }
  return ranks;
}

}  // namespace

ElasticRing::ElasticRing(RendezvousStore* store, CollectiveConfig config,
                         LiveFn live, Clock* clock)
    : store_(store),
      config_(std::move(config)),
      live_(std::move(live)),
      clock_(clock) {}

std::string ElasticRing::MembersKey(int64_t g) {
  return absl::StrCat("allreduce/elastic/", g, "/members");
}

std::string ElasticRing::NextKey(int64_t g, int rank) {
  return absl::StrCat("allreduce/elastic/", g, "/next/", rank);
}

std::string ElasticRing::CurrentKey() { return "allreduce/elastic/current"; }

int64_t ElasticRing::Current() {
  auto v = store_->StoreGet(CurrentKey(), absl::ZeroDuration());
  int64_t g = 0;
  if (!v.ok() || !absl::SimpleAtoi(*v, &g)) return 0;
  return g;
}

bool ElasticRing::SaidNext(int64_t g, int rank) {
  if (rank == config_.rank) return true;
  return store_->StoreGet(NextKey(g, rank), absl::ZeroDuration()).ok();
}

bool ElasticRing::InRing(int rank) const { return Has(members_, rank); }

bool ElasticRing::OutsiderWaiting() {
  for (int r : live_()) {
    if (!InRing(r) && SaidNext(generation_, r)) return true;
  }
  return false;
}

std::vector<int> ElasticRing::LeadFor(int64_t g, bool member) {
  const std::vector<int> live = live_();
  // Who must say next before g + 1 is written: at the start every rank
  // below the starting size; after that g's members that are still live.
  std::vector<int> awaited;
  if (g == 0) {
    for (int r = 0; r < config_.num_workers; ++r) awaited.push_back(r);
  } else {
    auto v = store_->StoreGet(MembersKey(g), absl::ZeroDuration());
    // Lost with a restart of shard 0: this rank's own memory of g, if any.
    const std::vector<int> of_g =
        v.ok() ? ParseRanks(*v) : (member ? members_ : std::vector<int>());
    for (int m : of_g) {
      if (Has(live, m)) awaited.push_back(m);
    }
  }
  std::vector<int> said;
  for (int r : awaited) {
    if (!SaidNext(g, r)) return {};
    said.push_back(r);
  }
  for (int r : live) {
    if (!Has(said, r) && SaidNext(g, r)) said.push_back(r);
  }
  if (!Has(said, config_.rank)) said.push_back(config_.rank);
  std::sort(said.begin(), said.end());
  if (said.front() != config_.rank) return {};  // The lowest leads.
  return said;
}

absl::StatusOr<std::vector<int>> ElasticRing::NextMembers(int64_t g,
                                                          bool member,
                                                          absl::Time deadline) {
  while (true) {
    // Said again each time: a shard 0 that restarted lost it.
    absl::Status said = store_->StoreSet(NextKey(g, config_.rank), "1");
    auto v = store_->StoreGet(MembersKey(g + 1), kPoll);
    if (v.ok()) {
      std::vector<int> next = ParseRanks(*v);
      if (!next.empty()) return next;
    }
    if (said.ok()) {
      std::vector<int> lead = LeadFor(g, member);
      if (!lead.empty()) {
        const std::string list = absl::StrJoin(lead, ",");
        RETURN_IF_ERROR(store_->StoreSet(MembersKey(g + 1), list));
        // Only where newcomers start looking: a failure here costs them a
        // generation's detour, nothing else.
        (void)store_->StoreSet(CurrentKey(), absl::StrCat(g + 1));
        LOG(INFO) << "rank " << config_.rank << ": ring generation " << g + 1
                  << " has ranks " << list;
        return lead;
      }
    }
    if (clock_->Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", config_.rank,
                       " waited in vain for the members of ring "
                       "generation ",
                       g + 1, ": the lowest rank that said next under '",
                       NextKey(g, config_.rank),
                       "' writes them once every live member "
                       "of generation ",
                       g, " has said it",
                       said.ok() ? "" : absl::StrCat(": ", said.message())));
    }
  }
}

absl::StatusOr<std::unique_ptr<Collective>> ElasticRing::Join(
    absl::Time deadline) {
  if (!in_ring_) generation_ = std::max(generation_, Current());
  while (true) {
    ASSIGN_OR_RETURN(const std::vector<int> next,
                     NextMembers(generation_, in_ring_, deadline));
    ++generation_;
    const auto it = std::find(next.begin(), next.end(), config_.rank);
    in_ring_ = it != next.end();
    if (!in_ring_) continue;  // Left out: waits for the one after.
    members_ = next;
    index_ = static_cast<int>(it - next.begin());
    CollectiveConfig cc = config_;
    cc.rank = index_;
    cc.num_workers = static_cast<int>(next.size());
    cc.prefix = absl::StrCat("allreduce/elastic/", generation_, "/ring");
    cc.join_timeout = JoinAttemptTimeout(config_, deadline - clock_->Now());
    auto joined = JoinCollective(cc, store_);
    if (joined.ok()) return joined;
    if (!JoinMayBeRetried(joined.status())) return joined.status();
    LOG(WARNING) << "rank " << config_.rank << ": joining ring generation "
                 << generation_ << " failed (" << joined.status().message()
                 << "); forming the next";
    if (clock_->Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("joining ring generation ", generation_, ": ",
                       joined.status().message()));
    }
  }
}

}  // namespace asyncps
