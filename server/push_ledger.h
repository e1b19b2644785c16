// PushLedger: what makes a retried push apply once. Each push carries
// (client id, sequence number); the ledger keeps, per client, the answers of
// its last kWindow pushes, so a retry (its answer was lost: a connection
// reset, a deadline, a shard answering UNAVAILABLE after applying) gets the
// first answer instead of a second update. A push still being applied when
// its retry arrives makes the retry wait its turn (UNAVAILABLE: the client
// backs off and asks again). Clients not heard from in the longest while
// are forgotten beyond kMaxClients. Thread-safe.
//
// One ledger per kind of push: dense pushes (PushLedger, in Consistency)
// and pushes of rows (RowsLedger, in EmbeddingTables) draw their sequence
// numbers from the same client counter, so each ledger sees a client's
// numbers with gaps, which the window allows.
#ifndef ASYNCPS_SERVER_PUSH_LEDGER_H_
#define ASYNCPS_SERVER_PUSH_LEDGER_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// `Request` has client_id() and sequence(); `Answer` is what a retry gets.
template <typename Request, typename Answer>
class AnswerLedger {
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
  Verdict Begin(const Request& request, Answer* answer) {
    if (request.client_id() == 0) return Verdict::kApply;
    absl::MutexLock lock(&mu_);
    Client& c = clients_[request.client_id()];
    c.last_used = ++tick_;
    for (const Entry& e : c.entries) {
      if (e.sequence != request.sequence()) continue;
      if (!e.done) return Verdict::kBusy;
      *answer = e.answer;
      return Verdict::kAnswered;
    }
    if (static_cast<int>(c.entries.size()) == kWindow) {
      uint64_t oldest = c.entries.front().sequence;
      for (const Entry& e : c.entries) oldest = std::min(oldest, e.sequence);
      if (request.sequence() < oldest) return Verdict::kTooOld;
      c.entries.pop_front();
    }
    c.entries.push_back(Entry{request.sequence(), false, {}});
    if (static_cast<int>(clients_.size()) > kMaxClients) Evict();
    return Verdict::kApply;
  }

  // Records how a push Begin said to apply went: its answer, or (on error)
  // that it was not applied, so a retry is judged again.
  void Finish(const Request& request, const absl::Status& status,
              const Answer& answer) {
    if (request.client_id() == 0) return;
    absl::MutexLock lock(&mu_);
    auto it = clients_.find(request.client_id());
    if (it == clients_.end()) return;
    std::deque<Entry>& entries = it->second.entries;
    for (auto e = entries.begin(); e != entries.end(); ++e) {
      if (e->sequence != request.sequence()) continue;
      if (status.ok()) {
        e->done = true;
        e->answer = answer;
      } else {
        entries.erase(e);
      }
      return;
    }
  }

  // A remembered answer, for a replicated shard's snapshot (server/
  // replication.h): a backup that imports them answers a retry as this
  // shard would.
  struct Remembered {
    uint64_t client_id;
    uint64_t sequence;
    Answer answer;
  };
  // Every answer remembered (pushes still being applied are left out).
  std::vector<Remembered> Export() {
    absl::MutexLock lock(&mu_);
    std::vector<Remembered> out;
    for (const auto& [id, c] : clients_) {
      for (const Entry& e : c.entries) {
        if (e.done) out.push_back(Remembered{id, e.sequence, e.answer});
      }
    }
    return out;
  }
  // Adds `remembered` (from Export) as answered pushes.
  void Import(const std::vector<Remembered>& remembered) {
    absl::MutexLock lock(&mu_);
    for (const Remembered& r : remembered) {
      Client& c = clients_[r.client_id];
      c.last_used = ++tick_;
      if (static_cast<int>(c.entries.size()) == kWindow) c.entries.pop_front();
      c.entries.push_back(Entry{r.sequence, true, r.answer});
    }
  }

  // The error a push judged kBusy or kTooOld gets (OK for the others).
  static absl::Status Refusal(Verdict verdict, const Request& request) {
    switch (verdict) {
      case Verdict::kBusy:
        return absl::UnavailableError(
            absl::StrCat("push ", request.sequence(),
                         " of this client is still being applied; ask again"));
      case Verdict::kTooOld:
        return absl::FailedPreconditionError(absl::StrCat(
            "push ", request.sequence(), " is older than the last ", kWindow,
            " pushes of this client this shard remembers; not applied"));
      default:
        return absl::OkStatus();
    }
  }

 private:
  struct Entry {
    uint64_t sequence;
    bool done;
    Answer answer;
  };
  struct Client {
    std::deque<Entry> entries;  // By arrival; at most kWindow.
    uint64_t last_used = 0;
  };

  void Evict() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto victim = clients_.begin();
    for (auto it = clients_.begin(); it != clients_.end(); ++it) {
      if (it->second.last_used < victim->second.last_used) victim = it;
    }
    clients_.erase(victim);
  }

  absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Client> clients_ ABSL_GUARDED_BY(mu_);
  uint64_t tick_ ABSL_GUARDED_BY(mu_) = 0;
};

using PushLedger = AnswerLedger<v1::PushRequest, v1::PushResponse>;
using RowsLedger = AnswerLedger<v1::PushRowsRequest, v1::PushRowsResponse>;

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_PUSH_LEDGER_H_
