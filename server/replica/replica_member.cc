#include "server/replica/replica_member.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/random_id.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/replica/group_records.h"
#include "transport/socket.h"

namespace asyncps {
namespace {

// An `insync` record ("epoch:backup,backup", RecordBackups): its epoch and
// whether it lists `member`; nullopt if it does not parse.
struct InSync {
  int64_t epoch = 0;
  bool lists_member = false;
};
std::optional<InSync> ParseInSync(absl::string_view value,
                                  absl::string_view member) {
  std::pair<absl::string_view, absl::string_view> parts =
      absl::StrSplit(value, absl::MaxSplits(':', 1));
  InSync r;
  if (!absl::SimpleAtoi(parts.first, &r.epoch)) return std::nullopt;
  for (absl::string_view b : absl::StrSplit(parts.second, ',')) {
    if (b == member) r.lists_member = true;
  }
  return r;
}

}  // namespace

ReplicaMember::ReplicaMember(ReplicaConfig config, Coordinator* coordinator,
                             Clock* clock)
    : config_(std::move(config)), coordinator_(coordinator), clock_(clock) {}

std::string ReplicaMember::Key(const std::string& name) const {
  return GroupKey(config_.prefix, shard_, name);
}

absl::StatusOr<std::unique_ptr<ReplicaMember>> ReplicaMember::Start(
    ShardServerConfig server, ReplicaConfig config, Coordinator* coordinator,
    Env env) {
  if (config.join_wait == absl::ZeroDuration()) {
    config.join_wait = 5 * config.lease_ttl;
  }
  std::unique_ptr<ReplicaMember> m(
      new ReplicaMember(std::move(config), coordinator, env.clock));
  m->shard_ = server.shard;
  ASSIGN_OR_RETURN(auto granted, coordinator->Grant(m->config_.lease_ttl));
  m->lease_ = granted.first;
  m->ttl_ = granted.second;
  m->lease_deadline_ = m->clock_->Now() + m->ttl_;
  if (m->config_.bootstrap) {
    ASSIGN_OR_RETURN(bool created,
                     CreateGroup(coordinator, m->config_.prefix, m->shard_));
    if (created) {
      LOG(INFO) << "shard " << m->shard_ << ": --bootstrap created the group";
    }
  }
  ASSIGN_OR_RETURN(server.incarnation,
                   GroupIncarnation(coordinator, m->config_.prefix, m->shard_));
  server.replicated = true;
  ASSIGN_OR_RETURN(m->server_, ShardServer::Start(server, env));
  if (m->config_.held != nullptr) m->TakeBack(*m->config_.held);
  Replication* r = m->server_->replication();
  m->member_ = r->member();
  r->set_backups_changed([p = m.get()](const std::vector<std::string>& b) {
    return p->RecordBackups(b);
  });
  r->set_join_check([p = m.get()](const std::string& joiner) {
    return p->CheckJoiner(joiner);
  });
  RETURN_IF_ERROR(
      coordinator->Put(m->Key("members/" + m->member_), "joining", m->lease_));
  m->watch_ = coordinator->WatchPrefix(m->Key(""), [p = m.get()] {
    absl::MutexLock lock(&p->mu_);
    p->wake_ = true;
  });
  m->loop_ = std::thread([p = m.get()] { p->Run(); });
  return m;
}

absl::Status ReplicaMember::CheckJoiner(const std::string& joiner) {
  auto listed = coordinator_->Get(Key("members/" + joiner));
  if (absl::IsNotFound(listed.status())) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard ", server_->config().shard, ": ", joiner,
        " may not join: it is not among the group's members in the "
        "coordinator (",
        Key("members/"), "...)"));
  }
  return listed.status();
}

absl::Status ReplicaMember::PutAsPrimary(std::vector<KeyPut> puts) {
  // The primary key's create revision is the epoch: while it holds, this
  // member's lease does, and no one else was elected since.
  return coordinator_->PutIf(
      {KeyRevision{Key("primary"), KeyRevision::Of::kCreate,
                   server_->replication()->epoch()}},
      puts);
}

absl::Status ReplicaMember::RecordBackups(
    const std::vector<std::string>& backups) {
  return PutAsPrimary(
      {KeyPut{Key("insync"), absl::StrCat(server_->replication()->epoch(), ":",
                                          absl::StrJoin(backups, ","))}});
}

absl::Status ReplicaMember::RecordJobDone(const std::string& key) {
  if (server_->replication()->role() != Replication::Role::kPrimary) {
    return absl::FailedPreconditionError("not the primary");
  }
  return PutAsPrimary({KeyPut{key, "1"}});
}

bool ReplicaMember::Renew() {
  const absl::Time now = clock_->Now();
  if (now < next_renewal_) return true;
  const bool primary =
      server_->replication()->role() == Replication::Role::kPrimary;
  // A lease that may have run out (the coordinator was out of reach) is
  // never trusted again, whatever the coordinator says of it later (etcd
  // renews an expired lease it has not revoked yet): a primary's role
  // ended with it, as the others may have seen; a backup takes a new one.
  if (now >= lease_deadline_) {
    if (primary) return false;
    Regrant(now);
    return true;
  }
  absl::Status s = coordinator_->KeepAlive(lease_);
  server_->replication()->NoteCoordinator(s);
  // A primary whose lease ran out while it waited for the answer has
  // stopped serving already (Replication::CheckServing): for good.
  if (primary && clock_->Now() >= lease_deadline_) return false;
  if (s.ok()) {
    lease_deadline_ = now + ttl_;
    next_renewal_ = now + ttl_ / 4;
    server_->replication()->ExtendLease(lease_deadline_);
    return true;
  }
  // Unreachable: keep trying until the lease must have expired.
  if (!absl::IsNotFound(s) && now < lease_deadline_) return true;
  // A primary's role went with its lease.
  if (primary) return false;
  Regrant(now);
  return true;
}

bool ReplicaMember::Regrant(absl::Time now) {
  coordinator_->Revoke(lease_).IgnoreError();
  // The lease runs from when it was asked for, not from `now` (the round's
  // start): the calls before it may have taken seconds (the coordinator
  // coming back from an outage), and a deadline counted from the round's
  // start had a member promoted with a lease already over.
  const absl::Time asked = std::max(now, clock_->Now());
  absl::StatusOr<std::pair<int64_t, absl::Duration>> granted =
      coordinator_->Grant(config_.lease_ttl);
  server_->replication()->NoteCoordinator(granted.status());
  if (!granted.ok()) return false;  // Again next round.
  lease_ = granted->first;
  ttl_ = granted->second;
  lease_deadline_ = asked + ttl_;
  next_renewal_ = asked + ttl_ / 4;
  coordinator_
      ->Put(Key("members/" + member_),
            Replication::RoleName(server_->replication()->role()), lease_)
      .IgnoreError();
  return true;
}

void ReplicaMember::Fence(const std::string& why) {
  server_->replication()->Fence(why);
  // It serves no more: the next member need not wait out its lease.
  coordinator_->Revoke(lease_).IgnoreError();
}

ReplicaMember::Campaign ReplicaMember::MayCampaign(absl::Time now) {
  absl::StatusOr<CoordinatedValue> insync = coordinator_->Get(Key("insync"));
  if (!insync.ok()) {
    // No records: the group was never created, or the coordinator lost
    // them. No one leads it; who holds the state cannot be known.
    if (absl::IsNotFound(insync.status()) && now >= next_complaint_) {
      LOG(ERROR) << NoGroupRecords(config_.prefix, shard_);
      next_complaint_ = now + absl::Seconds(10);
    }
    return Campaign::kWait;
  }
  insync_mod_ = insync->mod_revision;
  const std::optional<InSync> record = ParseInSync(insync->value, member_);
  if (!record.has_value()) return Campaign::kWait;
  if (record->epoch == 0) return Campaign::kNow;  // The group starts afresh.
  // The primary of the epoch `insync` records holds every change
  // acknowledged in it: its state taken back, it may lead again.
  if (following_ == 0 && held_epoch_ != 0 && record->epoch == held_epoch_) {
    return Campaign::kNow;
  }
  if (following_ != 0) {
    return server_->replication()->role() == Replication::Role::kBackup &&
                   record->epoch == following_ && record->lists_member
               ? Campaign::kNow
               : Campaign::kWait;
  }
  return now - no_primary_since_ >= config_.join_wait ? Campaign::kGroupLost
                                                      : Campaign::kWait;
}

bool ReplicaMember::Round() {
  const absl::Time now = clock_->Now();
  if (!Renew()) {  // Only a primary's renewal fails for good.
    lease_lost_ = true;
    Fence("its lease expired");
    return false;
  }
  const Replication::Role role = server_->replication()->role();
  if (role == Replication::Role::kFenced) return false;
  if (role == Replication::Role::kPrimary) return true;
  absl::StatusOr<CoordinatedValue> primary = coordinator_->Get(Key("primary"));
  if (primary.ok()) return FollowRound(*primary, now);
  if (!absl::IsNotFound(primary.status())) return true;  // Try again.
  if (no_primary_since_ == absl::InfinitePast()) no_primary_since_ = now;
  return CampaignRound(now);
}

bool ReplicaMember::FollowRound(const CoordinatedValue& primary,
                                absl::Time now) {
  no_primary_since_ = absl::InfinitePast();
  // This address's key from before a restart: gone with its lease soon.
  if (primary.value == member_) return true;
  const int64_t epoch = primary.create_revision;
  if (following_ == 0 && held_epoch_ != 0) {
    // Another member leads: its snapshot needs an empty store.
    Fence(absl::StrCat("member ", primary.value, " leads the group (epoch ",
                       epoch, "): this member starts again to join it"));
    return false;
  }
  if (following_ == 0) {
    following_ = epoch;
    server_->replication()->BecomeBackup(epoch, primary.value);
    follower_ = std::thread(
        [this, address = primary.value, epoch] { Follow(address, epoch); });
    return true;
  }
  if (following_ != epoch) {
    Fence(absl::StrCat("member ", primary.value, " was promoted (epoch ", epoch,
                       ")"));
    return false;
  }
  bool ended, broke;
  {
    absl::MutexLock lock(&mu_);
    ended = stream_ended_;
    broke = stream_broke_;
  }
  if (ended) {
    if (stream_ended_at_ == absl::InfinitePast()) stream_ended_at_ = now;
    // The primary's process seen gone: no need to wait out its lease.
    if (broke && absl::Now() >= next_probe_) {
      next_probe_ = absl::Now() + config_.poll;
      if (DeposeDeadPrimary(primary)) {
        no_primary_since_ = now;
        return CampaignRound(now);
      }
    }
    // A primary that drops a backup records `insync` without it before it
    // acknowledges anything more. Still listed, this member holds every
    // acknowledged change: the primary key outlives a dead primary when
    // etcd was away (its lease restored, and extended, as etcd came back),
    // and this member may be the group's only copy. It waits for the key
    // to go and campaigns. Fenced, it would start again empty.
    if (now - stream_ended_at_ > 2 * ttl_ && !ListedInSync()) {
      Fence("its primary dropped it from the stream");
      return false;
    }
  }
  return true;
}

bool ReplicaMember::ListedInSync() {
  absl::StatusOr<CoordinatedValue> insync = coordinator_->Get(Key("insync"));
  if (!insync.ok()) return !absl::IsNotFound(insync.status());  // Unknown.
  const std::optional<InSync> record = ParseInSync(insync->value, member_);
  return record.has_value() && record->epoch == following_ &&
         record->lists_member;
}

bool ReplicaMember::DeposeDeadPrimary(const CoordinatedValue& primary) {
  if (server_->replication()->role() != Replication::Role::kBackup) {
    return false;
  }
  // `insync` first: the transaction below holds only if it is unchanged
  // since, so a primary that dropped this member (and recorded so) after
  // this read is not deposed by it.
  absl::StatusOr<CoordinatedValue> insync = coordinator_->Get(Key("insync"));
  if (!insync.ok()) return false;
  const std::optional<InSync> record = ParseInSync(insync->value, member_);
  if (!record.has_value() || record->epoch != following_ ||
      !record->lists_member) {
    return false;
  }
  if (PrimaryMayLive(primary.value, following_)) return false;
  absl::Status s = coordinator_->DeleteIf(
      {KeyRevision{Key("primary"), KeyRevision::Of::kCreate, following_},
       KeyRevision{Key("insync"), KeyRevision::Of::kMod, insync->mod_revision}},
      {Key("primary")});
  if (!s.ok()) return false;
  LOG(WARNING) << "shard " << shard_ << ": member " << member_
               << " removed the key of primary " << primary.value << " (epoch "
               << following_
               << "): its stream broke and the process is gone; campaigns "
                  "without waiting for its lease";
  return true;
}

bool ReplicaMember::CampaignRound(absl::Time now) {
  switch (MayCampaign(now)) {
    case Campaign::kWait:
      if (following_ != 0 && now - no_primary_since_ >= config_.join_wait) {
        Fence("no primary came, and this member's state may lack changes");
        return false;
      }
      return true;
    case Campaign::kGroupLost:
      return StartGroupAgain();
    case Campaign::kNow:
      break;
  }
  // With a lease granted now: an older one may have run out while the
  // coordinator was out of reach, and the coordinator may revoke it any
  // moment (etcd renews such a lease until it gets to revoking it).
  if (!Regrant(now)) return true;
  absl::StatusOr<int64_t> won =
      coordinator_->CreateIfAbsent(Key("primary"), member_, lease_);
  if (!won.ok() || *won == 0) return true;
  return Promote(*won);
}

bool ReplicaMember::StartGroupAgain() {
  // Every member that held the group's state is gone. The group starts
  // again as a restarted shard does: a new incarnation (gradients computed
  // on the lost weights are known as such) and the workers' copy of the
  // weights (Consistency::Declare's restore).
  LOG(ERROR) << "shard " << shard_ << ": no member holding the group's "
             << "state came back within "
             << absl::FormatDuration(config_.join_wait)
             << "; the group starts again from the workers' copy";
  // Only if no one was elected and no one recorded anything since this
  // member read `insync` (another member may have started it again).
  absl::Status s = coordinator_->PutIf(
      {KeyRevision{Key("primary"), KeyRevision::Of::kCreate, 0},
       KeyRevision{Key("insync"), KeyRevision::Of::kMod, insync_mod_}},
      {KeyPut{Key("incarnation"), absl::StrCat(RandomId())},
       KeyPut{Key("insync"), "0:"}});
  if (!s.ok()) return true;  // Again next round, if still lost.
  Fence("the group starts again with a new incarnation");
  return false;
}

bool ReplicaMember::Promote(int64_t epoch) {
  // The stream of the old primary is over; its last ops are applied.
  {
    absl::MutexLock lock(&mu_);
    if (follower_fd_ >= 0) ShutdownSocket(follower_fd_);
  }
  if (follower_.joinable()) follower_.join();
  // The group's incarnation is the primary's: a member that joins with
  // another restarts and reads this one.
  absl::Status s = coordinator_->PutIf(
      {KeyRevision{Key("primary"), KeyRevision::Of::kCreate, epoch}},
      {KeyPut{Key("incarnation"), absl::StrCat(server_->store().incarnation())},
       KeyPut{Key("insync"), absl::StrCat(epoch, ":")}});
  if (!s.ok()) {
    Fence(absl::StrCat("cannot record its epoch: ", s.message()));
    return false;
  }
  server_->BecomingPrimary();
  server_->replication()->BecomePrimary(epoch, lease_deadline_);
  coordinator_->Put(Key("members/" + member_), "primary", lease_).IgnoreError();
  LOG(WARNING) << "shard " << shard_ << ": member " << member_
               << " is the primary now (epoch " << epoch << ")";
  return true;
}

void ReplicaMember::Run() {
  while (!stop_.HasBeenNotified()) {
    if (!Round()) {
      ended_.Notify();
      return;
    }
    // A watch wakes the loop when the group's keys change: the poll is
    // then only what the watch might miss (and the lease's renewal).
    const absl::Duration poll = watch_ != nullptr
                                    ? std::min(config_.watched_poll, ttl_ / 4)
                                    : config_.poll;
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&wake_), poll);
    wake_ = false;
  }
}

void ReplicaMember::Stop() {
  if (stop_.HasBeenNotified()) return;
  {
    absl::MutexLock lock(&mu_);
    stop_.Notify();
    wake_ = true;
    if (follower_fd_ >= 0) ShutdownSocket(follower_fd_);
  }
  if (loop_.joinable()) loop_.join();
  if (follower_.joinable()) follower_.join();
  watch_.reset();
  // Start failed before the server was up (the coordinator not reachable
  // yet, the port taken): nothing serves and the lease, if one was
  // granted, holds no key; it expires by itself.
  if (server_ == nullptr) return;
  // Serves nothing more (calls in flight are answered UNAVAILABLE, as a
  // dead process's are to its clients), then lets the next primary in at
  // once, unless killed: then the lease is left to expire.
  if (killed_) {
    server_->replication()->Fence("killed");
  } else {
    Fence("stopping");
  }
  server_->Shutdown();
}

void ReplicaMember::Kill() {
  killed_ = true;
  Stop();
}

bool ReplicaMember::Ended(absl::Duration timeout) {
  return ended_.WaitForNotificationWithTimeout(timeout);
}

}  // namespace asyncps
