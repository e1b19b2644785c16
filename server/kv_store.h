// KvStore: a small key-value store for the rendezvous of allreduce workers
// (Gloo's and NCCL's addresses). A Get may wait for its key; waiting calls
// are held, not blocking a thread. Thread-safe.
#ifndef ASYNCPS_SERVER_KV_STORE_H_
#define ASYNCPS_SERVER_KV_STORE_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/held_calls.h"

namespace asyncps {

inline constexpr size_t kMaxKvKeyBytes = 1024;
inline constexpr size_t kMaxKvValueBytes = 1 << 20;
// The store holds one job's rendezvous (ring addresses, NCCL ids): a few
// keys per ring generation. These bound what a writer can make it hold.
inline constexpr size_t kMaxKvKeys = 65536;
inline constexpr size_t kMaxKvTotalBytes = 64 << 20;  // Keys and values.
inline constexpr absl::Duration kMaxKvWait = absl::Hours(1);

class KvStore {
 public:
  // `clock` is borrowed and must outlive this.
  explicit KvStore(Clock* clock) : clock_(clock) {}
  ~KvStore() { Shutdown(); }

  // INVALID_ARGUMENT for an empty or over-long key or a value over
  // kMaxKvValueBytes; RESOURCE_EXHAUSTED past kMaxKvKeys or
  // kMaxKvTotalBytes (nothing stored). Answers the Gets waiting for `key`.
  absl::Status Set(const std::string& key, std::string value);
  // Answers `call` with the value of `key` in `*value`: at once, or
  // NOT_FOUND if it is missing and `wait` is not positive, or once it is set,
  // or DEADLINE_EXCEEDED after `wait` (at most kMaxKvWait) or the call's
  // deadline. `value` must stay valid until the call is answered.
  void Get(const std::string& key, absl::Duration wait, std::string* value,
           PendingCall call);
  // Answers waiting Gets whose time is up.
  void Expire();
  // Answers every waiting Get, and every later one that would wait, with
  // UNAVAILABLE.
  void Shutdown();

  size_t waiting() { return waiters_.size(); }

 private:
  struct Wait {
    std::string key;
    std::string* value;
  };
  // Answers calls a sweep took out unanswered: CANCELLED where the caller
  // has gone, DEADLINE_EXCEEDED where its wait ran out.
  static void AnswerExpired(std::vector<HeldCalls<Wait>::Held>* expired);

  Clock* const clock_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  size_t bytes_ ABSL_GUARDED_BY(mu_) = 0;  // Of values_' keys and values.
  HeldCalls<Wait> waiters_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_KV_STORE_H_
