// FNV-1a, 64-bit: the one non-cryptographic hash of asyncps (initializer
// streams from tensor names, replica checksums of weights).
#ifndef ASYNCPS_COMMON_HASH_H_
#define ASYNCPS_COMMON_HASH_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace asyncps {

inline constexpr uint64_t kFnv1aOffset = 1469598103934665603ull;

// Continues the hash `h` over `bytes`; start with kFnv1aOffset.
inline uint64_t Fnv1a64(absl::string_view bytes, uint64_t h = kFnv1aOffset) {
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_HASH_H_
