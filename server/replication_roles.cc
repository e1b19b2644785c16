// Replication's roles (server/replication.h): becoming a backup or the
// primary, the lease, fencing, and the checks a write passes first: the
// primary within its lease (CheckServing) and enough members in sync
// (CheckInSync, --min_insync); and the Stats a member reports.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/replication.h"
#include "transport/socket.h"

namespace asyncps {

const char* Replication::RoleName(Role role) {
  switch (role) {
    case Role::kJoining:
      return "joining";
    case Role::kBackup:
      return "backup";
    case Role::kPrimary:
      return "primary";
    case Role::kFenced:
      return "fenced";
  }
  return "?";
}

Replication::Replication(ShardStore* store, PushLedger* ledger, Clock* clock,
                         std::string member, PushPolicy base_policy,
                         absl::Duration ack_timeout)
    : store_(store),
      ledger_(ledger),
      clock_(clock),
      base_policy_(base_policy),
      ack_timeout_(ack_timeout) {
  set_member(std::move(member));
}

void Replication::BecomeBackup(int64_t epoch, std::string primary) {
  absl::MutexLock lock(&mu_);
  if (role_ == Role::kFenced) return;
  role_ = Role::kJoining;
  epoch_ = epoch;
  primary_ = std::move(primary);
}

void Replication::BecomePrimary(int64_t epoch, absl::Time lease_deadline) {
  absl::MutexLock order(&order_mu_);
  absl::MutexLock lock(&mu_);
  if (role_ == Role::kFenced) return;
  role_ = Role::kPrimary;
  epoch_ = epoch;
  primary_ = member_;
  lease_deadline_ = lease_deadline;
  promoted_at_ = clock_->Now();
  ++failovers_;
  // A promoted backup goes on numbering where its primary's stream was.
  seq_ = applied_;
}

void Replication::ExtendLease(absl::Time lease_deadline) {
  absl::MutexLock lock(&mu_);
  lease_deadline_ = std::max(lease_deadline_, lease_deadline);
}

void Replication::NoteCoordinator(const absl::Status& status) {
  const absl::Time now = clock_->Now();
  absl::MutexLock lock(&mu_);
  if (status.ok()) {
    coordinator_error_.clear();
    return;
  }
  if (coordinator_error_.empty()) coordinator_failing_since_ = now;
  coordinator_error_ = status.ToString();
}

void Replication::Fence(const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    if (role_ == Role::kFenced) return;
    LOG(WARNING) << "shard " << store_->shard() << " member " << member_ << " ("
                 << RoleName(role_) << ", epoch " << epoch_
                 << ") stops serving: " << why;
    role_ = Role::kFenced;
  }
  // Their serving threads end; the backups are noted without a write to
  // the coordinator.
  absl::MutexLock order(&order_mu_);
  absl::MutexLock lock(&ack_mu_);
  for (const std::shared_ptr<Backup>& b : backups_) {
    Drop(b.get(), absl::UnavailableError("the primary is fenced: " + why));
  }
}

absl::Time Replication::lease_deadline() const {
  absl::ReaderMutexLock lock(&mu_);
  return lease_deadline_;
}

absl::Time Replication::promoted_at() const {
  absl::ReaderMutexLock lock(&mu_);
  return promoted_at_;
}

void Replication::set_member(std::string member) {
  absl::MutexLock lock(&mu_);
  member_ = std::move(member);
}

std::string Replication::member() const {
  absl::ReaderMutexLock lock(&mu_);
  return member_;
}

Replication::Role Replication::role() const {
  absl::ReaderMutexLock lock(&mu_);
  return role_;
}

int64_t Replication::epoch() const {
  absl::ReaderMutexLock lock(&mu_);
  return epoch_;
}

absl::Status Replication::CheckPrimaryLocked() const {
  if (role_ == Role::kPrimary && clock_->Now() < lease_deadline_) {
    return absl::OkStatus();
  }
  const std::string primary =
      primary_.empty() || primary_ == member_ ? "unknown" : primary_;
  if (role_ == Role::kPrimary) {
    return absl::UnavailableError(
        absl::StrCat("shard ", store_->shard(), ": member ", member_,
                     " cannot renew its lease as primary (epoch ", epoch_,
                     "); try the group's other members"));
  }
  return absl::UnavailableError(
      absl::StrCat("shard ", store_->shard(), ": member ", member_, " is ",
                   role_ == Role::kFenced ? "fenced" : "a backup",
                   ", not the primary (primary: ", primary, ", epoch ", epoch_,
                   "); try the group's other members"));
}

absl::Status Replication::CheckServing() const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckPrimaryLocked();
}

absl::Status Replication::CheckInSyncLocked() const {
  const int in_sync = 1 + static_cast<int>(backup_names_.size());
  if (in_sync >= min_insync_) return absl::OkStatus();
  below_min_insync_.fetch_add(1, std::memory_order_relaxed);
  return absl::UnavailableError(absl::StrCat(
      "shard ", store_->shard(), ": only ", in_sync,
      " member(s) of the group (", member_, " and ", backup_names_.size(),
      " backup(s)) hold its changes, fewer than --min_insync=", min_insync_,
      "; changes wait until a backup joins (reads go on)"));
}

absl::Status Replication::CheckInSync() const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckInSyncLocked();
}

absl::Status Replication::CheckWritable() const {
  absl::ReaderMutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckPrimaryLocked());
  return CheckInSyncLocked();
}

v1::ReplicaStats Replication::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  v1::ReplicaStats stats;
  stats.set_role(RoleName(role_));
  stats.set_epoch(epoch_);
  stats.set_member(member_);
  stats.set_primary(primary_);
  for (const std::string& b : backup_names_) stats.add_backups(b);
  stats.set_applied_seq(applied_);
  // A primary's: the most ops a backup in the stream has yet to
  // acknowledge (streamed, not yet answered); a backup's: 0.
  int64_t lag = 0;
  {
    absl::MutexLock ack(&ack_mu_);
    for (const std::shared_ptr<Backup>& b : backups_) {
      if (!b->dropped && applied_ > b->acked) {
        lag = std::max(lag, static_cast<int64_t>(applied_ - b->acked));
      }
    }
  }
  stats.set_lag(lag);
  stats.set_replicated_bytes(bytes_);
  stats.set_failovers(failovers_);
  if (role_ == Role::kPrimary) {
    stats.set_in_sync(1 + static_cast<int>(backup_names_.size()));
  }
  stats.set_min_insync(min_insync_);
  stats.set_below_min_insync(below_min_insync_);
  if (!coordinator_error_.empty()) {
    stats.set_coordinator_error(coordinator_error_);
    stats.set_coordinator_failing_seconds(
        absl::ToDoubleSeconds(clock_->Now() - coordinator_failing_since_));
  }
  return stats;
}

}  // namespace asyncps
