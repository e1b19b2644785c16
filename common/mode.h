// Consistency modes and stale-gradient policies, shared by servers and
// workers (see docs/DESIGN.md).
#ifndef ASYNCPS_COMMON_MODE_H_
#define ASYNCPS_COMMON_MODE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace asyncps {

enum class Mode { kAsync, kSsp, kBsp, kAllreduce };

// "async", "ssp", "bsp", "allreduce".
absl::StatusOr<Mode> ParseMode(const std::string& text);
std::string ModeName(Mode mode);

// What an async or ssp server does with a stale gradient.
struct StalePolicy {
  enum Kind { kNone, kDrop, kScale, kCompensate };
  Kind kind = kNone;
  int64_t max_staleness = 0;  // kDrop: gradients staler than this are dropped.
  // kCompensate (DC-ASGD, Zheng et al., ICML 2017): a gradient g computed
  // from weights w_stale is applied as g + lambda * g * g * (w_now -
  // w_stale), elementwise, with w_stale kept for the last `window` versions
  // of each slice (server/stale_weights.h; older: applied as it is).
  float dc_lambda = 0.0f;
  int dc_window = 16;
  // DC-ASGD-a ("dca:"): lambda per element, dc_lambda / sqrt(ms + 1e-7),
  // ms = 0.95 * ms + 0.05 * g * g updated with every gradient applied to
  // the slice (the paper's running mean square).
  bool dc_adaptive = false;
};

// The longest --stale_policy=dc window: each version kept costs a copy of
// the shard's weights.
inline constexpr int kMaxCompensationWindow = 1024;

// "none", "drop:K" (K >= 0), "scale" (learning rate / (1 + staleness)), or
// "dc:LAMBDA" / "dc:LAMBDA:WINDOW" (LAMBDA >= 0, 1 <= WINDOW <= 1024;
// delay compensation, kCompensate), or "dca:" the same with an adaptive
// lambda (dc_adaptive).
absl::StatusOr<StalePolicy> ParseStalePolicy(const std::string& text);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_MODE_H_
