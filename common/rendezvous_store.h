// RendezvousStore: where the workers of a collective meet (Gloo's and NCCL's
// addresses): a key-value store whose Get can wait for a key. Collectives
// depend on this interface, not on how it is reached (PsClient implements it
// over the servers' StoreSet/StoreGet; a test can keep one in memory).
#ifndef ASYNCPS_COMMON_RENDEZVOUS_STORE_H_
#define ASYNCPS_COMMON_RENDEZVOUS_STORE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asyncps {

// Implementations are thread-safe.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status StoreSet(const std::string& key,
                                const std::string& value) = 0;
  // The value of `key`, waiting up to `wait` for it to be set;
  // DEADLINE_EXCEEDED if it was not.
  virtual absl::StatusOr<std::string> StoreGet(const std::string& key,
                                               absl::Duration wait) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_RENDEZVOUS_STORE_H_
