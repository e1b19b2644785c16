#include "server/push_ledger.h"

#include <algorithm>

namespace asyncps {

PushLedger::Verdict PushLedger::Begin(const v1::PushRequest& request,
                                      v1::PushResponse* answer) {
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

void PushLedger::Finish(const v1::PushRequest& request,
                        const absl::Status& status,
                        const v1::PushResponse& answer) {
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

void PushLedger::Evict() {
  auto victim = clients_.begin();
  for (auto it = clients_.begin(); it != clients_.end(); ++it) {
    if (it->second.last_used < victim->second.last_used) victim = it;
  }
  clients_.erase(victim);
}

}  // namespace asyncps
