// RendezvousClient: the key-value store on shard 0 (common/
// rendezvous_store.h), where allreduce's collectives find each other. The
// store lives in shard 0's memory, so a restart loses it: this client
// remembers what it set (the last kRememberedSets keys) and sets it again
// while it waits for a key. Calls go through a ShardCaller
// (client/shard_caller.h), e.g. a PsClient's. Thread-safe.
#ifndef ASYNCPS_CLIENT_RENDEZVOUS_CLIENT_H_
#define ASYNCPS_CLIENT_RENDEZVOUS_CLIENT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/shard_caller.h"
#include "common/rendezvous_store.h"

namespace asyncps {

class RendezvousClient final : public RendezvousStore {
 public:
  // `caller` is borrowed and must outlive this client.
  explicit RendezvousClient(ShardCaller* caller) : caller_(caller) {}

  absl::Status StoreSet(const std::string& key,
                        const std::string& value) override;
  // Waits up to `wait` for the key, a second at a time; between waits it
  // sets its own keys again (another rank may be waiting for them on a
  // shard 0 that restarted since they were set).
  absl::StatusOr<std::string> StoreGet(const std::string& key,
                                       absl::Duration wait) override;
  static constexpr size_t kRememberedSets = 256;
  // One StoreSet call to shard 0 (not remembered).
  absl::Status SetOnShard0(const std::string& key, const std::string& value);

 private:
  ShardCaller* const caller_;
  absl::Mutex sets_mu_;
  // What StoreSet set, oldest first (for setting it again).
  std::vector<std::pair<std::string, std::string>> sets_
      ABSL_GUARDED_BY(sets_mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_RENDEZVOUS_CLIENT_H_
