// MemoryCoordinator: the Coordinator (server/replica/coordinator.h) in
// memory, for tests: one store of keys and leases shared by the members of a
// group in one process, each through a View that a test can cut off from it
// (a partition). Leases expire by an injected clock. Thread-safe.
#ifndef ASYNCPS_SERVER_REPLICA_TESTING_MEMORY_COORDINATOR_H_
#define ASYNCPS_SERVER_REPLICA_TESTING_MEMORY_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/replica/coordinator.h"

namespace asyncps {

// The keys are in memory; leases expire by `clock`. Members each take a
// View, which a test can cut off (every call UNAVAILABLE) to partition that
// member from the others' coordinator.
class MemoryCoordinator {
 public:
  // `clock` is borrowed and must outlive this.
  explicit MemoryCoordinator(Clock* clock = Clock::Real()) : clock_(clock) {}

  class View final : public Coordinator {
   public:
    explicit View(MemoryCoordinator* store) : store_(store) {}
    // While cut, every call is UNAVAILABLE (and nothing it would do
    // happens), as when the member cannot reach the service.
    void set_cut(bool cut) {
      absl::MutexLock lock(&mu_);
      cut_ = cut;
    }
    // Runs at the start of each Get, with its key: a test's way to make a
    // read slow (advance a ManualClock), as etcd coming back from an
    // outage is. Set before the member starts.
    void set_before_get(std::function<void(const std::string&)> f) {
      before_get_ = std::move(f);
    }

    absl::StatusOr<std::pair<int64_t, absl::Duration>> Grant(
        absl::Duration ttl) override;
    absl::Status KeepAlive(int64_t lease) override;
    absl::Status Revoke(int64_t lease) override;
    absl::StatusOr<int64_t> CreateIfAbsent(const std::string& key,
                                           const std::string& value,
                                           int64_t lease) override;
    absl::Status Put(const std::string& key, const std::string& value,
                     int64_t lease) override;
    absl::Status PutIf(const std::vector<KeyRevision>& conditions,
                       const std::vector<KeyPut>& puts) override;
    absl::Status DeleteIf(const std::vector<KeyRevision>& conditions,
                          const std::vector<std::string>& keys) override;
    absl::StatusOr<CoordinatedValue> Get(const std::string& key) override;
    absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>> List(
        const std::string& prefix) override;
    // Calls `changed` on the watch's thread after any change to the keys
    // (any prefix: it only says when to look), while the view is not cut.
    std::unique_ptr<Watch> WatchPrefix(const std::string& prefix,
                                       std::function<void()> changed) override;
    bool cut() {
      absl::MutexLock lock(&mu_);
      return cut_;
    }

   private:
    absl::Status Reachable();
    // FAILED_PRECONDITION unless every condition holds.
    absl::Status CheckLocked(const std::vector<KeyRevision>& conditions)
        ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_->mu_);
    MemoryCoordinator* const store_;
    absl::Mutex mu_;
    bool cut_ ABSL_GUARDED_BY(mu_) = false;
    std::function<void(const std::string&)> before_get_;
  };

  // Moves every live lease's expiry `by` later, as etcd does to each lease
  // when it comes back (restarted with its data, or a new leader): a dead
  // member's keys outlive it by that much.
  void ExtendLeases(absl::Duration by) {
    absl::MutexLock lock(&mu_);
    Expire();
    for (auto& [id, lease] : leases_) lease.expires += by;
  }

  // Loses every key and lease, as an etcd restarted without its data.
  void Clear() {
    {
      absl::MutexLock lock(&mu_);
      keys_.clear();
      leases_.clear();
      changed_ = true;
    }
    Publish();
  }

  // A new view (a member's session); owned by the caller.
  std::unique_ptr<View> NewView() { return std::make_unique<View>(this); }

 private:
  struct Lease {
    absl::Duration ttl;
    absl::Time expires;
  };
  // Deletes expired leases and their keys.
  void Expire() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropLease(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status CheckLease(int64_t lease) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PutLocked(const KeyPut& put, int64_t revision)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Tells the watches if the keys changed since the last call (a lease's
  // expiry included): each View call makes one on its way out.
  void Publish() ABSL_LOCKS_EXCLUDED(mu_);
  // Publish on scope exit: declared before a call's lock on mu_, so it
  // runs after the lock is released.
  struct Publisher {
    MemoryCoordinator* store;
    ~Publisher() { store->Publish(); }
  };
  class MemoryWatch;

  Clock* const clock_;
  absl::Mutex mu_;
  bool changed_ ABSL_GUARDED_BY(mu_) = false;
  // Counts the changes published; the watches wait on it.
  absl::Mutex watch_mu_;
  int64_t generation_ ABSL_GUARDED_BY(watch_mu_) = 0;
  int64_t revision_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t next_lease_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, Lease> leases_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, CoordinatedValue> keys_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_TESTING_MEMORY_COORDINATOR_H_
