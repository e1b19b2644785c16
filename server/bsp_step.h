// The two rules that decide when a pending bsp step is applied, shared by
// the dense slices (SliceState) and the embedding tables (EmbeddingTable):
// a step goes once a quorum of ranks pushed it or --step_deadline passed
// since its first push (StepDue), and healing lets it go without ranks
// that will not send their share (NotSending, MayHeal).
#ifndef ASYNCPS_SERVER_BSP_STEP_H_
#define ASYNCPS_SERVER_BSP_STEP_H_

#include <algorithm>
#include <limits>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"

namespace asyncps {

// The quorum of a shard that does not know how many ranks the job has (it
// restarted, and no worker has registered again yet): no step goes by
// count.
inline constexpr int kUnknownQuorum = std::numeric_limits<int>::max();

// True if a step with pushes from `ranks` (the first at `first`) may be
// applied now: it has any, and `quorum` of them or its first came
// `deadline` (if > 0) before `now`.
inline bool StepDue(const std::vector<int>& ranks, int quorum,
                    absl::Duration deadline, absl::Time first, absl::Time now) {
  return !ranks.empty() &&
         (static_cast<int>(ranks.size()) >= quorum ||
          (deadline > absl::ZeroDuration() && now - first >= deadline));
}

// The live ranks that will not send their share of a pending step: those
// blocked in a held pull here (`stuck`), and those that said, in a
// heartbeat or a registration, that they completed the step (`done`: rank
// to steps completed). A rank's shares of a step it completed were all
// sent and acknowledged (its gradients, and EndStep's no-gradient marks),
// so one missing here went to an earlier incarnation of this shard, or its
// rank went on without it (it resumed past the step).
struct NotSending {
  absl::flat_hash_set<int> stuck;
  absl::flat_hash_map<int, int64_t> done;

  bool Contains(int rank, int64_t step) const {
    if (stuck.contains(rank)) return true;
    auto it = done.find(rank);
    return it != done.end() && it->second >= step;
  }
};

// True if step `step`, with pushes from `ranks` (the first at `first`, at
// least `bound` before `now`), may be applied without the ranks of
// `live_ranks` missing from it: there are some, and every one of them is
// in `not_sending`. `*left_out` gets those ranks when true, and is cleared
// otherwise.
inline bool MayHeal(const std::vector<int>& ranks, absl::Time first,
                    int64_t step, const std::vector<int>& live_ranks,
                    const NotSending& not_sending, absl::Duration bound,
                    absl::Time now, std::vector<int>* left_out) {
  left_out->clear();
  if (ranks.empty() || now - first < bound) return false;
  for (int r : live_ranks) {
    if (std::find(ranks.begin(), ranks.end(), r) != ranks.end()) continue;
    if (!not_sending.Contains(r, step)) {
      left_out->clear();
      return false;
    }
    left_out->push_back(r);
  }
  return !left_out->empty();
}

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_BSP_STEP_H_
