// StaleWeights: the last few versions of one slice's weights, for delay
// compensation (--stale_policy=dc, DC-ASGD: common/mode.h): a gradient
// computed from version v is compensated with w_now - w_v while v is held.
// Memory: `window` copies of the slice (the shard's weights times the
// window in all). Not saved in checkpoints: after a restore the window
// starts again from the restored weights. Thread-compatible (the slice's
// lock).
#ifndef ASYNCPS_SERVER_STALE_WEIGHTS_H_
#define ASYNCPS_SERVER_STALE_WEIGHTS_H_

#include <cstdint>
#include <vector>

#include "absl/types/span.h"

namespace asyncps {

class StaleWeights {
 public:
  // Keeps `weights` as version `version`, in place of the oldest once
  // `window` are held. Versions are recorded in increasing order.
  void Record(int64_t version, absl::Span<const float> weights, int window);
  // The weights of `version`, or an empty span if not held (older than the
  // window, or from before the first Record).
  absl::Span<const float> Find(int64_t version) const;
  // Whether anything is held.
  bool empty() const { return versions_.empty(); }
  // Forgets every version (the weights were replaced: an assignment, a
  // restore).
  void Clear();

 private:
  // Slot k holds version versions_[k], at values_[k * n, (k + 1) * n).
  std::vector<int64_t> versions_;
  std::vector<float> values_;
  size_t next_ = 0;  // The slot the next Record overwrites once full.
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_STALE_WEIGHTS_H_
