// Deterministic initial values. Element i of a tensor is a function of
// (seed, tensor name, i) only, so a shard fills just its own slices and gets
// the same numbers whatever the number of shards.
#ifndef ASYNCPS_COMMON_INITIALIZER_H_
#define ASYNCPS_COMMON_INITIALIZER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// INVALID_ARGUMENT naming the field if `init` is unusable.
absl::Status ValidateInitializer(const v1::Initializer& init,
                                 absl::string_view tensor);

// Fills `out` with elements [begin, begin + out.size()) of the tensor.
// REQUIRES: ValidateInitializer(init, ...).ok().
void FillInitial(const v1::Initializer& init, uint64_t seed,
                 absl::string_view tensor, uint64_t begin,
                 absl::Span<float> out);

// A 64-bit mix (SplitMix64's finaliser); exposed for tests.
uint64_t Mix64(uint64_t x);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_INITIALIZER_H_
