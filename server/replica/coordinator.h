// Coordinator: what a replicated shard group needs of a coordination service
// (leases, keys bound to them, a revision that only grows), and nothing
// more. EtcdCoordinator (server/replica/etcd_coordinator.h) is the real one,
// over etcd's v3 gRPC API; MemoryCoordinator
// (server/replica/testing/memory_coordinator.h) is an in-process one for
// tests, with a switch that cuts one member off from it (a partition). The
// election and the shard map are written once, against this interface
// (server/replica/replica_member.h). Thread-safe.
#ifndef ASYNCPS_SERVER_REPLICA_COORDINATOR_H_
#define ASYNCPS_SERVER_REPLICA_COORDINATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace asyncps {

// A key's value and when it was written, as etcd's mvccpb.KeyValue.
struct CoordinatedValue {
  std::string value;
  int64_t create_revision = 0;  // Grows with every key created anywhere.
  int64_t mod_revision = 0;
  int64_t lease = 0;  // 0: none.
};

// A condition of a transaction, as etcd's Compare: `key`'s create or mod
// revision equals `revision` (0: the key does not exist).
struct KeyRevision {
  enum class Of { kCreate, kMod };
  std::string key;
  Of of = Of::kCreate;
  int64_t revision = 0;
};

// One key a transaction sets, bound to `lease` (0: none).
struct KeyPut {
  std::string key;
  std::string value;
  int64_t lease = 0;
};

class Coordinator {
 public:
  virtual ~Coordinator() = default;

  // A new lease that expires `ttl` after its grant or last KeepAlive
  // (etcd rounds up to whole seconds and grants no less than its minimum).
  // Returns its id and the TTL granted.
  virtual absl::StatusOr<std::pair<int64_t, absl::Duration>> Grant(
      absl::Duration ttl) = 0;
  // Renews `lease`: NOT_FOUND once it expired or was revoked (its keys are
  // gone), UNAVAILABLE if the service cannot be reached.
  virtual absl::Status KeepAlive(int64_t lease) = 0;
  // Ends `lease` now; its keys are deleted.
  virtual absl::Status Revoke(int64_t lease) = 0;
  // Creates `key` = `value`, bound to `lease` (0: none), unless the key
  // exists. Returns the new key's create revision, or 0 if it existed.
  virtual absl::StatusOr<int64_t> CreateIfAbsent(const std::string& key,
                                                 const std::string& value,
                                                 int64_t lease) = 0;
  // Sets `key` = `value`, bound to `lease` (0: none).
  virtual absl::Status Put(const std::string& key, const std::string& value,
                           int64_t lease) = 0;
  // Sets every key of `puts` in one transaction if every condition holds;
  // else writes nothing and returns FAILED_PRECONDITION naming the
  // condition's key. How a member fences its writes: a primary's records
  // are conditional on the primary key still being its own (its create
  // revision is the epoch), so a primary deposed while paused cannot
  // overwrite its successor's.
  virtual absl::Status PutIf(const std::vector<KeyRevision>& conditions,
                             const std::vector<KeyPut>& puts) = 0;
  // Deletes every key of `keys` in one transaction if every condition
  // holds; else deletes nothing and returns FAILED_PRECONDITION as PutIf.
  // How a backup removes the key of a primary it saw die, so as not to
  // wait out the dead one's lease: only while the key is still that
  // primary's and `insync` is as the backup read it.
  virtual absl::Status DeleteIf(const std::vector<KeyRevision>& conditions,
                                const std::vector<std::string>& keys) = 0;
  // NOT_FOUND if `key` does not exist.
  virtual absl::StatusOr<CoordinatedValue> Get(const std::string& key) = 0;
  // Every key that starts with `prefix`, in key order.
  virtual absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>>
  List(const std::string& prefix) = 0;

  // A watch on the keys under a prefix: ends (and calls nothing more) when
  // destroyed.
  class Watch {
   public:
    virtual ~Watch() = default;
  };
  // Calls `changed` (on a thread of the watch's own, never with a lock of
  // the caller's held) soon after a key under `prefix` is created, changed
  // or deleted, a lease's expiry included, and each time the watch is
  // (re)established, since changes may have been missed while it was
  // down. It says when to look, not what changed: the caller reads the keys
  // itself, and keeps a slower poll for what the watch might miss.
  virtual std::unique_ptr<Watch> WatchPrefix(const std::string& prefix,
                                             std::function<void()> changed) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_COORDINATOR_H_
