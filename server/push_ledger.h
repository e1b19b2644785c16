// PushLedger: what makes a retried push apply once. Each push carries
// (client id, sequence number); the ledger keeps, per client, the answers of
// its last kWindow pushes, so a retry (its answer was lost: a connection
// reset, a deadline, a shard answering UNAVAILABLE after applying) gets the
// first answer instead of a second update. A push still being applied when
// its retry arrives makes the retry wait its turn (UNAVAILABLE: the client
// backs off and asks again). Clients not heard from in the longest while
// are forgotten beyond kMaxClients. Thread-safe.
#ifndef ASYNCPS_SERVER_PUSH_LEDGER_H_
#define ASYNCPS_SERVER_PUSH_LEDGER_H_

#include <cstdint>
#include <deque>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

class PushLedger {
 public:
  // Answers remembered per client, and clients remembered.
  static constexpr int kWindow = 8;
  static constexpr int kMaxClients = 1024;

  enum class Verdict {
    kApply,     // New: apply it, then Finish.
    kAnswered,  // A retry of a push already applied: `*answer` is its answer.
    kBusy,      // Its first copy is still being applied.
    kTooOld,    // Older than the window: refused, nothing applied.
  };

  // Looks `request` up. client_id 0 has no identity: always kApply (and
  // Finish is then a no-op).
  Verdict Begin(const v1::PushRequest& request, v1::PushResponse* answer);
  // Records how a push Begin said to apply went: its answer, or (on error)
  // that it was not applied, so a retry is judged again.
  void Finish(const v1::PushRequest& request, const absl::Status& status,
              const v1::PushResponse& answer);

 private:
  struct Entry {
    uint64_t sequence;
    bool done;
    v1::PushResponse answer;
  };
  struct Client {
    std::deque<Entry> entries;  // By arrival; at most kWindow.
    uint64_t last_used = 0;
  };
  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Client> clients_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PUSH_LEDGER_H_
