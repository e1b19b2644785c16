// The rendezvous store in memory, for tests of how collectives meet.
#ifndef ASYNCPS_TESTS_WORKER_MEMORY_STORE_H_
#define ASYNCPS_TESTS_WORKER_MEMORY_STORE_H_

#include <map>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rendezvous_store.h"

namespace asyncps {

// The rendezvous store in memory. Thread-safe.
class MemoryStore final : public RendezvousStore {
 public:
  absl::Status StoreSet(const std::string& key,
                        const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> StoreGet(const std::string& key,
                                       absl::Duration wait) override {
    absl::MutexLock lock(&mu_);
    auto set = [this, &key]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return values_.count(key) > 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&set), wait)) {
      return absl::DeadlineExceededError(key);
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_TESTS_WORKER_MEMORY_STORE_H_
