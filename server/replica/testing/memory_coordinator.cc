#include "server/replica/testing/memory_coordinator.h"

#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {

void MemoryCoordinator::DropLease(int64_t id) {
  leases_.erase(id);
  for (auto it = keys_.begin(); it != keys_.end();) {
    if (it->second.lease == id) {
      changed_ = true;
      it = keys_.erase(it);
    } else {
      ++it;
    }
  }
}

void MemoryCoordinator::Expire() {
  const absl::Time now = clock_->Now();
  std::vector<int64_t> expired;
  for (const auto& [id, lease] : leases_) {
    if (lease.expires <= now) expired.push_back(id);
  }
  for (int64_t id : expired) DropLease(id);
}

absl::Status MemoryCoordinator::CheckLease(int64_t lease) {
  if (lease == 0 || leases_.count(lease) > 0) return absl::OkStatus();
  return absl::NotFoundError(absl::StrCat("lease ", lease, " not found"));
}

absl::Status MemoryCoordinator::View::Reachable() {
  absl::MutexLock lock(&mu_);
  if (cut_) return absl::UnavailableError("coordinator unreachable (cut)");
  return absl::OkStatus();
}

absl::StatusOr<std::pair<int64_t, absl::Duration>>
MemoryCoordinator::View::Grant(absl::Duration ttl) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->Expire();
  const int64_t id = ++store_->next_lease_;
  store_->leases_[id] = Lease{ttl, store_->clock_->Now() + ttl};
  return std::make_pair(id, ttl);
}

absl::Status MemoryCoordinator::View::KeepAlive(int64_t lease) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->Expire();
  auto it = store_->leases_.find(lease);
  if (it == store_->leases_.end()) {
    return absl::NotFoundError(absl::StrCat("lease ", lease, " expired"));
  }
  it->second.expires = store_->clock_->Now() + it->second.ttl;
  return absl::OkStatus();
}

absl::Status MemoryCoordinator::View::Revoke(int64_t lease) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->DropLease(lease);
  return absl::OkStatus();
}

absl::StatusOr<int64_t> MemoryCoordinator::View::CreateIfAbsent(
    const std::string& key, const std::string& value, int64_t lease) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->Expire();
  if (absl::Status s = store_->CheckLease(lease); !s.ok()) return s;
  if (store_->keys_.count(key) > 0) return 0;
  const int64_t revision = ++store_->revision_;
  store_->keys_[key] = CoordinatedValue{value, revision, revision, lease};
  store_->changed_ = true;
  return revision;
}

absl::Status MemoryCoordinator::View::Put(const std::string& key,
                                          const std::string& value,
                                          int64_t lease) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->Expire();
  if (absl::Status s = store_->CheckLease(lease); !s.ok()) return s;
  store_->PutLocked(KeyPut{key, value, lease}, ++store_->revision_);
  return absl::OkStatus();
}

void MemoryCoordinator::PutLocked(const KeyPut& put, int64_t revision) {
  changed_ = true;
  auto [it, created] = keys_.try_emplace(put.key);
  if (created) it->second.create_revision = revision;
  it->second.value = put.value;
  it->second.mod_revision = revision;
  it->second.lease = put.lease;
}

absl::Status MemoryCoordinator::View::CheckLocked(
    const std::vector<KeyRevision>& conditions) {
  store_->Expire();
  for (const KeyRevision& c : conditions) {
    auto it = store_->keys_.find(c.key);
    int64_t revision = 0;
    if (it != store_->keys_.end()) {
      revision = c.of == KeyRevision::Of::kCreate ? it->second.create_revision
                                                  : it->second.mod_revision;
    }
    if (revision != c.revision) {
      return absl::FailedPreconditionError(
          absl::StrCat("transaction refused: ", c.key, " is at revision ",
                       revision, ", not ", c.revision));
    }
  }
  return absl::OkStatus();
}

absl::Status MemoryCoordinator::View::PutIf(
    const std::vector<KeyRevision>& conditions,
    const std::vector<KeyPut>& puts) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  RETURN_IF_ERROR(CheckLocked(conditions));
  for (const KeyPut& p : puts) {
    if (absl::Status s = store_->CheckLease(p.lease); !s.ok()) return s;
  }
  const int64_t revision = ++store_->revision_;
  for (const KeyPut& p : puts) store_->PutLocked(p, revision);
  return absl::OkStatus();
}

absl::Status MemoryCoordinator::View::DeleteIf(
    const std::vector<KeyRevision>& conditions,
    const std::vector<std::string>& keys) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  RETURN_IF_ERROR(CheckLocked(conditions));
  ++store_->revision_;
  for (const std::string& key : keys) store_->keys_.erase(key);
  store_->changed_ = true;
  return absl::OkStatus();
}

absl::StatusOr<CoordinatedValue> MemoryCoordinator::View::Get(
    const std::string& key) {
  if (before_get_) before_get_(key);
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->Expire();
  auto it = store_->keys_.find(key);
  if (it == store_->keys_.end()) {
    return absl::NotFoundError(absl::StrCat("no key ", key));
  }
  return it->second;
}

absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>>
MemoryCoordinator::View::List(const std::string& prefix) {
  if (absl::Status s = Reachable(); !s.ok()) return s;
  Publisher publish{store_};
  absl::MutexLock lock(&store_->mu_);
  store_->Expire();
  std::vector<std::pair<std::string, CoordinatedValue>> out;
  for (auto it = store_->keys_.lower_bound(prefix);
       it != store_->keys_.end() && absl::StartsWith(it->first, prefix); ++it) {
    out.push_back(*it);
  }
  return out;
}

void MemoryCoordinator::Publish() {
  {
    absl::MutexLock lock(&mu_);
    if (!changed_) return;
    changed_ = false;
  }
  absl::MutexLock lock(&watch_mu_);
  ++generation_;
}

// A watch: a thread that calls its callback each time the generation
// moved, unless its view is cut.
class MemoryCoordinator::MemoryWatch final : public Coordinator::Watch {
 public:
  MemoryWatch(MemoryCoordinator* store, View* view,
              std::function<void()> changed)
      : store_(store), view_(view), changed_(std::move(changed)) {
    absl::MutexLock lock(&store_->watch_mu_);
    seen_ = store_->generation_;
    thread_ = std::thread([this] { Run(); });
  }
  ~MemoryWatch() override {
    {
      absl::MutexLock lock(&store_->watch_mu_);
      stop_ = true;
    }
    thread_.join();
  }

 private:
  void Run() {
    if (!view_->cut()) changed_();  // Established.
    while (true) {
      {
        absl::MutexLock lock(&store_->watch_mu_);
        auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(store_->watch_mu_) {
          return stop_ || store_->generation_ != seen_;
        };
        store_->watch_mu_.Await(absl::Condition(&ready));
        if (stop_) return;
        seen_ = store_->generation_;
      }
      if (!view_->cut()) changed_();
    }
  }

  MemoryCoordinator* const store_;
  View* const view_;
  const std::function<void()> changed_;
  int64_t seen_ = 0;   // Under store_->watch_mu_.
  bool stop_ = false;  // Under store_->watch_mu_.
  std::thread thread_;
};

std::unique_ptr<Coordinator::Watch> MemoryCoordinator::View::WatchPrefix(
    const std::string& /*prefix*/, std::function<void()> changed) {
  return std::make_unique<MemoryWatch>(store_, this, std::move(changed));
}

}  // namespace asyncps
