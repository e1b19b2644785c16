// ReplicaMember's states driven by a ManualClock and the in-memory
// coordinator: the member's lease, the coordinator's and the server's
// Replication::CheckServing read the one Env clock, so moving it moves all
// three (issue #39: before, the lease deadline was wall time while
// CheckServing read the Env's clock).
#include "server/replica/replica_member.h"

#include <atomic>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/env.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "server/replica/testing/memory_coordinator.h"
#include "tests/server/small_model.h"
#include "transport/socket.h"

namespace asyncps::testing {
namespace {

constexpr absl::Duration kTtl = absl::Seconds(1);

ShardServerConfig MemberConfig() {
  ShardServerConfig c;
  c.host = "127.0.0.1";
  return c;
}

ReplicaConfig FastConfig() {
  ReplicaConfig rc;
  rc.lease_ttl = kTtl;
  rc.poll = absl::Milliseconds(10);  // Real time between rounds,
  rc.watched_poll = rc.poll;         // the coordinator watched or not.
  rc.bootstrap = true;
  return rc;
}

// Waits in real time (the member's loop runs on its own thread) until
// `done`, up to 20 s.
template <typename F>
bool Eventually(F done) {
  const absl::Time give_up = absl::Now() + absl::Seconds(20);
  while (absl::Now() < give_up) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

class ReplicaMemberClockTest : public ::testing::Test {
 protected:
  ReplicaMemberClockTest() : coordinator_(&clock_) {
    env_.clock = &clock_;
    // B's reads of `insync` may be made slow (a coordinator coming back
    // from an outage) or held at a gate (KillOutOfSight).
    view_b_->set_before_get([this](const std::string& key) {
      if (!absl::EndsWith(key, "/insync")) return;
      if (slow_) clock_.Advance(kTtl * 9 / 10);
      absl::MutexLock lock(&gate_mu_);
      gate_mu_.Await(absl::Condition(&gate_open_));
    });
  }

  std::unique_ptr<ReplicaMember> StartMember(MemoryCoordinator::View* view,
                                             ReplicaConfig rc = FastConfig()) {
    auto m = ReplicaMember::Start(MemberConfig(), rc, view, env_);
    EXPECT_TRUE(m.ok()) << m.status();
    return m.ok() ? std::move(*m) : nullptr;
  }

  // Member A, once it leads the group (null if it does not within 20 s).
  std::unique_ptr<ReplicaMember> StartPrimary() {
    std::unique_ptr<ReplicaMember> a = StartMember(view_a_.get());
    if (a == nullptr ||
        !Eventually([&] { return a->role() == Replication::Role::kPrimary; })) {
      return nullptr;
    }
    return a;
  }

  // Member B, once it follows the primary and the primary lists it in
  // `insync` (null if not within 20 s).
  std::unique_ptr<ReplicaMember> StartBackupInSync() {
    std::unique_ptr<ReplicaMember> b = StartMember(view_b_.get());
    if (b == nullptr || !Eventually([&] {
          auto insync = view_b_->Get("/asyncps/default/shard/0/insync");
          return b->role() == Replication::Role::kBackup && insync.ok() &&
                 absl::StrContains(insync->value, b->member());
        })) {
      return nullptr;
    }
    return b;
  }

  // Kills `a` (as SIGKILL would) and, before its backup may look, puts
  // `instead` at its port (a listener that never answers: `a` seen as
  // cut off by a partition, so its lease decides; or a fresh member, a
  // process a supervisor started in its place). Returns a's port.
  template <typename Instead>
  int KillAndPut(ReplicaMember* a, Instead instead) {
    {
      absl::MutexLock lock(&gate_mu_);
      gate_open_ = false;
    }
    const int port = a->server()->port();
    a->Kill();
    instead(port);
    absl::MutexLock lock(&gate_mu_);
    gate_open_ = true;
    return port;
  }
  // KillAndPut with a silent listener, kept open until the test ends.
  void KillOutOfSight(ReplicaMember* a) {
    KillAndPut(a, [&](int port) {
      int bound = 0;
      absl::StatusOr<Socket> l;
      // Tried again while the killed listener closes, as in
      // APrimaryRestartedInPlaceIsReplacedAtOnce.
      Eventually([&] {
        l = ListenTcp("127.0.0.1", port, &bound);
        return l.ok();
      });
      ASSERT_TRUE(l.ok()) << l.status();
      silent_ = std::move(*l);
    });
  }

  // Declared first: outlive the members.
  Socket silent_;
  std::atomic<bool> slow_{false};
  absl::Mutex gate_mu_;
  bool gate_open_ ABSL_GUARDED_BY(gate_mu_) = true;
  ManualClock clock_{absl::FromUnixSeconds(1000)};
  MemoryCoordinator coordinator_;
  Env env_;
  std::unique_ptr<MemoryCoordinator::View> view_a_ = coordinator_.NewView();
  std::unique_ptr<MemoryCoordinator::View> view_b_ = coordinator_.NewView();
};

TEST_F(ReplicaMemberClockTest, PrimaryStopsServingWhenItsLeaseRunsOut) {
  std::unique_ptr<ReplicaMember> a = StartMember(view_a_.get());
  ASSERT_NE(a, nullptr);
  // A new group: the only member campaigns and wins at once.
  ASSERT_TRUE(
      Eventually([&] { return a->role() == Replication::Role::kPrimary; }));
  EXPECT_TRUE(a->server()->replication()->CheckServing().ok());
  EXPECT_FALSE(a->Ended(absl::Milliseconds(100)));

  // Without any wall time passing, the lease runs out on the Env's clock:
  // the server refuses at once, the member fences itself, and the
  // coordinator (same clock) has dropped the primary key.
  clock_.Advance(2 * kTtl);
  EXPECT_FALSE(a->server()->replication()->CheckServing().ok());
  EXPECT_TRUE(a->Ended(absl::Seconds(20)));
  EXPECT_EQ(a->role(), Replication::Role::kFenced);
  EXPECT_TRUE(absl::IsNotFound(
      view_b_->Get("/asyncps/default/shard/0/primary").status()));
}

// psctl doctor (issue #44) names a member that cannot reach etcd: its
// Stats say why and since when while its calls fail, and nothing once
// they go through again.
TEST_F(ReplicaMemberClockTest, StatsSayWhenTheCoordinatorIsOutOfReach) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  EXPECT_TRUE(a->server()->replication()->Stats().coordinator_error().empty());
  view_a_->set_cut(true);
  clock_.Advance(kTtl / 3);  // Time to renew the lease: the call fails.
  ASSERT_TRUE(Eventually([&] {
    return !a->server()->replication()->Stats().coordinator_error().empty();
  }));
  view_a_->set_cut(false);
  clock_.Advance(kTtl / 3);  // Still within the lease: renewed.
  ASSERT_TRUE(Eventually([&] {
    return a->server()->replication()->Stats().coordinator_error().empty();
  }));
  EXPECT_EQ(a->role(), Replication::Role::kPrimary);
}

// Issue #40, failover: a primary killed (its process gone, its port
// refusing) is replaced as soon as its backup's stream breaks, not once its
// lease runs out: the clock does not move here at all.
TEST_F(ReplicaMemberClockTest,
       AKilledPrimaryIsReplacedWithoutWaitingForItsLease) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);
  a->Kill();
  ASSERT_TRUE(Eventually([&] {
    return b->role() == Replication::Role::kPrimary;
  })) << "the backup waited for the dead primary's lease";
  auto primary = view_b_->Get("/asyncps/default/shard/0/primary");
  ASSERT_TRUE(primary.ok()) << primary.status();
  EXPECT_EQ(primary->value, b->member());
  EXPECT_TRUE(b->server()->replication()->CheckServing().ok());
}

// The same when a supervisor has already started a fresh member on the
// killed primary's port: what answers there says it is not the primary.
TEST_F(ReplicaMemberClockTest, APrimaryRestartedInPlaceIsReplacedAtOnce) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);
  auto view_c = coordinator_.NewView();  // Outlives the member on it.
  std::unique_ptr<ReplicaMember> again;
  KillAndPut(a.get(), [&](int port) {
    ShardServerConfig c = MemberConfig();
    c.port = port;
    ReplicaConfig rc = FastConfig();
    rc.bootstrap = false;
    // The killed member's listener closes on gRPC's own thread a moment
    // after Kill returns (CI once saw EADDRINUSE here): a supervisor's
    // restart tries again, and so does this one.
    absl::StatusOr<std::unique_ptr<ReplicaMember>> m;
    ASSERT_TRUE(Eventually([&] {
      m = ReplicaMember::Start(c, rc, view_c.get(), env_);
      return m.ok() || !absl::IsUnavailable(m.status());
    }));
    ASSERT_TRUE(m.ok()) << m.status();
    again = std::move(*m);
  });
  ASSERT_TRUE(
      Eventually([&] { return b->role() == Replication::Role::kPrimary; }));
  // The restarted member joins the new primary as its backup.
  EXPECT_TRUE(
      Eventually([&] { return again->role() == Replication::Role::kBackup; }));
}

// A primary that dropped its backup recorded `insync` without it before
// acknowledging anything more; that backup, its stream broken, must not
// take the group when the primary then dies, even though the primary is
// seen gone at once: it lacks what the primary acknowledged alone since.
TEST_F(ReplicaMemberClockTest, ABackupItsPrimaryDroppedDoesNotTakeTheGroup) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);
  const std::string key = "/asyncps/default/shard/0/insync";
  const int64_t epoch = a->server()->replication()->epoch();
  KillAndPut(a.get(), [&](int) {
    // a's last record, as it would have written it dropping b.
    ASSERT_TRUE(view_a_->Put(key, absl::StrCat(epoch, ":"), 0).ok());
  });
  absl::SleepFor(absl::Milliseconds(300));  // b's rounds look, and wait.
  EXPECT_NE(b->role(), Replication::Role::kPrimary)
      << "a backup the primary had dropped took the group";
  auto primary = view_b_->Get("/asyncps/default/shard/0/primary");
  ASSERT_TRUE(primary.ok()) << "the dead primary's key was removed";
  EXPECT_EQ(primary->create_revision, epoch);
}

// The backstop: a primary whose backup cannot see it gone (its port
// takes connections but nothing answers: a partition, as far as the backup
// can tell) keeps its role until its lease runs out; then the backup,
// listed in `insync`, campaigns and is promoted.
TEST_F(ReplicaMemberClockTest, InSyncBackupCampaignsOnceThePrimaryKeyIsGone) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  // B follows A and A lists it in sync.
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);

  // A goes silent; its key stays while its lease lasts.
  KillOutOfSight(a.get());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_EQ(b->role(), Replication::Role::kBackup);
  EXPECT_TRUE(view_b_->Get("/asyncps/default/shard/0/primary").ok());

  // The lease runs out on the clock: B campaigns and is promoted.
  clock_.Advance(kTtl + kTtl / 2);
  ASSERT_TRUE(
      Eventually([&] { return b->role() == Replication::Role::kPrimary; }));
  auto primary = view_b_->Get("/asyncps/default/shard/0/primary");
  ASSERT_TRUE(primary.ok()) << primary.status();
  EXPECT_EQ(primary->value, b->member());
  EXPECT_TRUE(b->server()->replication()->CheckServing().ok());
  EXPECT_FALSE(b->Ended(absl::Milliseconds(100)));
}

// A backup campaigning while the coordinator is slow (it reads `insync`
// for most of a lease, as etcd does coming back from an outage) is
// promoted with a lease counted from when it was granted. Before, the
// deadline was counted from the round's start: the member was promoted
// with a lease nearly over and fenced itself at once, and with its old
// primary fenced too the group had no primary left (found by replica_test's
// tcp_etcd_tls case).
TEST_F(ReplicaMemberClockTest,
       ASlowCoordinatorDoesNotShortenANewPrimarysLease) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);
  KillOutOfSight(a.get());
  slow_ = true;
  clock_.Advance(kTtl + kTtl / 2);  // a's lease runs out; b campaigns.
  ASSERT_TRUE(
      Eventually([&] { return b->role() == Replication::Role::kPrimary; }));
  slow_ = false;
  const absl::Time promoted = b->server()->replication()->promoted_at();
  EXPECT_GE(b->server()->replication()->lease_deadline(), promoted + kTtl / 2)
      << "promoted with a lease already (nearly) over";
  EXPECT_TRUE(b->server()->replication()->CheckServing().ok());
}

// The history checker's etcd_restart fault (seed 1 of async/r2): etcd came
// back with the dead primary's key, its lease extended, for more than two
// leases after the backup's stream ended. The backup took that for being
// dropped by a live primary and started again empty, though `insync` still
// listed it as the group's only copy: an acknowledged push was lost. Now
// it waits while listed, and is promoted once the key is gone.
TEST_F(ReplicaMemberClockTest, ABackupStillInSyncOutwaitsALingeringPrimaryKey) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);
  KillOutOfSight(a.get());
  absl::SleepFor(absl::Milliseconds(200));  // b's rounds see the stream end.
  coordinator_.ExtendLeases(4 * kTtl);
  clock_.Advance(kTtl * 5 / 2);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(b->role(), Replication::Role::kBackup)
      << "the group's only copy started again empty";
  EXPECT_TRUE(view_b_->Get("/asyncps/default/shard/0/primary").ok());
  clock_.Advance(3 * kTtl);  // The key's lease runs out at last.
  ASSERT_TRUE(
      Eventually([&] { return b->role() == Replication::Role::kPrimary; }));
}

// Issue #40, "No promotion of an empty member": the coordinator loses
// every key (an etcd restarted without its data). The primary's lease is
// gone with them, so it stops; the backup, which holds the state, finds no
// records and does not take the group; a fresh member does not start in
// it. Before, a missing `insync` counted as a new group any member could
// lead: the backup, or a member with no state, took it.
TEST_F(ReplicaMemberClockTest, NoMemberLeadsAGroupWhoseRecordsWereLost) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);

  coordinator_.Clear();
  // Past the primary's lease and the backup's join_wait, a little at a
  // time so the members' rounds see each moment.
  for (int i = 0; i < 20; ++i) {
    clock_.Advance(kTtl / 2);
    absl::SleepFor(absl::Milliseconds(30));
    ASSERT_NE(b->role(), Replication::Role::kPrimary);
  }
  EXPECT_TRUE(a->Ended(absl::Seconds(20)));  // Its lease went with the keys.
  EXPECT_TRUE(absl::IsNotFound(
      view_b_->Get("/asyncps/default/shard/0/primary").status()));
  EXPECT_TRUE(absl::IsNotFound(
      view_b_->Get("/asyncps/default/shard/0/insync").status()));

  // A fresh member (no --bootstrap: ps_server's restarted members never
  // have it) does not start.
  ReplicaConfig fresh = FastConfig();
  fresh.bootstrap = false;
  auto view_c = coordinator_.NewView();
  auto c = ReplicaMember::Start(MemberConfig(), fresh, view_c.get(), env_);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition)
      << c.status();
}

// Issue #40, "Watch etcd instead of polling it": with no poll to speak of
// (an hour between rounds, and as long a lease) a backup still campaigns
// as soon as the primary key goes, woken by its watch on the group's keys.
// The key is deleted by hand, its primary left running, so that nothing
// else could wake the backup (no stream breaks).
TEST_F(ReplicaMemberClockTest, TheWatchWakesABackupWhenThePrimaryKeyGoes) {
  ReplicaConfig slow = FastConfig();
  slow.lease_ttl = absl::Hours(1);
  slow.poll = slow.watched_poll = absl::Hours(1);
  std::unique_ptr<ReplicaMember> a = StartMember(view_a_.get(), slow);
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(  // Its first round, at its start.
      Eventually([&] { return a->role() == Replication::Role::kPrimary; }));
  std::unique_ptr<ReplicaMember> b = StartMember(view_b_.get(), slow);
  ASSERT_NE(b, nullptr);
  const std::string insync = "/asyncps/default/shard/0/insync";
  ASSERT_TRUE(Eventually([&] {
    auto listed = view_b_->Get(insync);
    return b->role() == Replication::Role::kBackup && listed.ok() &&
           absl::StrContains(listed->value, b->member());
  }));
  ASSERT_TRUE(view_b_->DeleteIf({}, {"/asyncps/default/shard/0/primary"}).ok());
  EXPECT_TRUE(Eventually([&] {
    return b->role() == Replication::Role::kPrimary;
  })) << "the backup did not look until its next poll, an hour away";
}

// Found by the history checker (seed 10: two etcd outages a second
// apart): a primary fenced because its lease ran out (the coordinator out
// of reach) was started again empty, although it held every change
// acknowledged in its epoch; its backup gone too, the group's state was
// lost. The member started in its place takes that state back and leads
// again, `insync` still carrying its epoch. (Without it: no member may
// lead, the clock standing still before join_wait.)
TEST_F(ReplicaMemberClockTest, APrimaryFencedForItsLeaseKeepsItsState) {
  std::unique_ptr<ReplicaMember> a = StartPrimary();
  ASSERT_NE(a, nullptr);
  std::unique_ptr<ReplicaMember> b = StartBackupInSync();
  ASSERT_NE(b, nullptr);
  Replication* r = a->server()->replication();
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = SmallModel();
  ASSERT_TRUE(r->Declare(declare).ok());
  v1::PushResponse answer;  // 10 - 3, on both members.
  ASSERT_TRUE(r->Push(SmallModelPush(3.0f), PushPolicy(), &answer).ok());
  b->Kill();
  view_a_->set_cut(true);    // The coordinator out of reach...
  clock_.Advance(2 * kTtl);  // ...past the lease.
  ASSERT_TRUE(a->Ended(absl::Seconds(20)));
  std::shared_ptr<const HeldState> held = a->TakeHeldState();
  ASSERT_NE(held, nullptr);
  a->Stop();
  view_a_->set_cut(false);
  ReplicaConfig rc = FastConfig();
  rc.held = held;
  std::unique_ptr<ReplicaMember> again = StartMember(view_a_.get(), rc);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(Eventually([&] {
    return again->role() == Replication::Role::kPrimary;
  })) << "the member holding the group's state did not lead it";
  v1::PullRequest pull;
  *pull.add_slices() = SmallModelKey();
  v1::PullResponse pulled;
  ASSERT_TRUE(again->server()->store().Pull(pull, &pulled).ok());
  std::vector<float> w(4);
  DecodeF32(pulled.slices(0).data(), absl::MakeSpan(w));
  EXPECT_EQ(w, std::vector<float>(4, 7.0f));
}

}  // namespace
}  // namespace asyncps::testing
