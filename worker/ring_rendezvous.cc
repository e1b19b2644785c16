#include "worker/ring_rendezvous.h"

#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "glog/logging.h"

namespace asyncps {
namespace {

// How often Agree looks at what the others ask for.
constexpr absl::Duration kPoll = absl::Milliseconds(100);
// How long a join's wait for a key goes on before it looks whether the
// others have moved to a newer generation (long enough for the store's
// client to set its keys again in between, see RendezvousClient).
constexpr absl::Duration kGuardedWait = absl::Seconds(2);

}  // namespace

// The store as the join of generation `g` sees it: a wait for a key gives
// up, ABORTED, once some rank asks for a newer generation (the peer it
// waits for will not come to this one).
class RingRendezvous::Guarded final : public RendezvousStore {
 public:
  Guarded(RingRendezvous* ring, int64_t g) : ring_(ring), g_(g) {}

  absl::Status StoreSet(const std::string& key,
                        const std::string& value) override {
    return ring_->store_->StoreSet(key, value);
  }

  absl::StatusOr<std::string> StoreGet(const std::string& key,
                                       absl::Duration wait) override {
    const absl::Time deadline = ring_->clock_->Now() + wait;
    while (true) {
      const absl::Duration left = deadline - ring_->clock_->Now();
      auto v = ring_->store_->StoreGet(key, std::min(left, kGuardedWait));
      if (v.ok() || v.status().code() != absl::StatusCode::kDeadlineExceeded ||
          ring_->clock_->Now() >= deadline) {
        return v;
      }
      if (ring_->NewerAsked(g_)) {
        return absl::AbortedError(
            absl::StrCat("waiting for '", key, "' in ring generation ", g_,
                         ": a rank asks for a newer one"));
      }
    }
  }

 private:
  RingRendezvous* const ring_;
  const int64_t g_;
};

RingRendezvous::RingRendezvous(RendezvousStore* store, CollectiveConfig config,
                               Clock* clock)
    : store_(store), config_(std::move(config)), clock_(clock) {}

std::string RingRendezvous::GenerationKey(int rank) {
  return absl::StrCat("allreduce/gen/", rank);
}

std::vector<std::optional<int64_t>> RingRendezvous::Asked() {
  std::vector<std::optional<int64_t>> asked(config_.num_workers);
  for (int r = 0; r < config_.num_workers; ++r) {
    auto v = store_->StoreGet(GenerationKey(r), absl::ZeroDuration());
    int64_t g = 0;
    if (v.ok() && absl::SimpleAtoi(*v, &g)) asked[r] = g;
  }
  return asked;
}

bool RingRendezvous::NewerAsked(int64_t g) {
  for (const auto& a : Asked()) {
    if (a.has_value() && *a > g) return true;
  }
  return false;
}

absl::StatusOr<int64_t> RingRendezvous::Agree(absl::Time deadline) {
  absl::Status set_failed;
  while (true) {
    std::vector<std::optional<int64_t>> asked = Asked();
    for (const auto& a : asked) want_ = std::max(want_, a.value_or(0));
    if (asked[config_.rank] != want_) {
      // Also after shard 0 restarted and lost it.
      set_failed =
          store_->StoreSet(GenerationKey(config_.rank), absl::StrCat(want_));
      if (set_failed.ok()) asked[config_.rank] = want_;
    }
    if (std::all_of(asked.begin(), asked.end(),
                    [this](const auto& a) { return a == want_; })) {
      return want_;
    }
    if (clock_->Now() >= deadline) {
      std::string said;
      for (int r = 0; r < config_.num_workers; ++r) {
        absl::StrAppend(&said, r == 0 ? "" : ", ", "rank ", r, ": ",
                        asked[r].has_value() ? absl::StrCat(*asked[r])
                                             : std::string("none"));
      }
      return absl::DeadlineExceededError(absl::StrCat(
          "no ring of ", config_.num_workers,
          " ranks agreed in time; the ring generation each asks for: ", said,
          set_failed.ok() ? ""
                          : absl::StrCat(" (", set_failed.message(), ")")));
    }
    clock_->SleepFor(kPoll);
  }
}

absl::StatusOr<std::unique_ptr<Collective>> RingRendezvous::Join(
    absl::Time deadline) {
  while (true) {
    absl::StatusOr<int64_t> g = Agree(deadline);
    if (!g.ok()) return g.status();
    CollectiveConfig cc = config_;
    cc.prefix = absl::StrCat("allreduce/ring", *g);
    // A join waits only for ranks that asked for this generation: it is
    // quick unless one of them died meanwhile, and then the next is tried.
    cc.join_timeout = JoinAttemptTimeout(config_, deadline - clock_->Now());
    Guarded guarded(this, *g);
    // The collective keeps no reference to the store once joined.
    auto joined = JoinCollective(cc, &guarded);
    if (joined.ok()) {
      generation_ = *g;
      return joined;
    }
    if (!JoinMayBeRetried(joined.status())) return joined.status();
    LOG(WARNING) << "rank " << config_.rank << ": joining ring generation "
                 << *g << " failed (" << joined.status().message()
                 << "); asking for generation " << *g + 1;
    want_ = std::max(want_, *g + 1);
    if (clock_->Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "joining ring generation ", *g, ": ", joined.status().message()));
    }
  }
}

}  // namespace asyncps
