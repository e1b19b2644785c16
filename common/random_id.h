// RandomId: a random 64-bit value, never 0, from the operating system's
// random source (std::random_device: RDRAND or /dev/urandom). For ids that
// must not collide across processes (client ids, shard incarnations) and
// for per-registration secrets, which must not be guessable.
#ifndef ASYNCPS_COMMON_RANDOM_ID_H_
#define ASYNCPS_COMMON_RANDOM_ID_H_

#include <cstdint>
#include <random>

namespace asyncps {

inline uint64_t RandomId() {
  std::random_device random;
  uint64_t id = 0;
  while (id == 0) id = (uint64_t{random()} << 32) | random();
  return id;
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_RANDOM_ID_H_
