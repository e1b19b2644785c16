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
  enum Kind { kNone, kDrop, kScale };
  Kind kind = kNone;
  int64_t max_staleness = 0;  // kDrop: gradients staler than this are dropped.
};

// "none", "drop:K" (K >= 0), or "scale" (learning rate / (1 + staleness)).
absl::StatusOr<StalePolicy> ParseStalePolicy(const std::string& text);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_MODE_H_
