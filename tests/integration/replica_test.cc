// Replicated shards (server/replica/replica_member.h), in process over real
// sockets, coordinated by the in-memory coordinator or by a real etcd (a
// private etcd-server process per test): a client pushes a known gradient
// stream with SGD (weights 0, learning rate 1, gradient 1: every weight is
// exactly minus the pushes applied) through a group of members while members
// die. Afterwards every member's weights equal minus the number of acknowledged
// pushes, exactly: nothing acknowledged was lost, nothing applied twice.
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/integration/replica_fixture.h"

namespace asyncps::testing {
namespace {

TEST_P(ReplicaTest, PrimaryKilledMidStreamLosesNoAcknowledgedPush) {
  Member& a = StartAs(Replication::Role::kPrimary);
  Member& b = StartAs(Replication::Role::kBackup);
  auto client = DeclaredClient();
  ASSERT_FALSE(HasFailure());
  int pushed = 0;
  Push(client.get(), 10, &pushed);
  // Killed while pushes go on.
  std::thread killer([&] { a.member->Kill(); });
  Push(client.get(), 20, &pushed);
  killer.join();
  Push(client.get(), 5, &pushed);  // After the kill, whenever it came.
  EXPECT_TRUE(Is(b, Replication::Role::kPrimary));
  ExpectWeights(b, pushed);
  // A new member joins the promoted one and holds the same.
  Member& c = StartAs(Replication::Role::kBackup);
  ASSERT_FALSE(HasFailure());
  Push(client.get(), 5, &pushed);
  ExpectWeights(b, pushed);
  ExpectWeights(c, pushed);
  // What psctl status and /metrics show of each member (a client that
  // knows all three).
  auto viewer = Client(Group(), /*rank=*/-1);
  AdminClient admin(viewer->caller());
  EXPECT_FALSE(admin.MemberStats(0, 0).ok());  // a is gone.
  auto stats = admin.MemberStats(0, 1);
  ASSERT_TRUE(stats.ok()) << stats.status();
  const v1::ReplicaStats& r = stats->replica();
  EXPECT_EQ(r.role(), "primary");
  EXPECT_EQ(r.failovers(), 1);
  ASSERT_EQ(r.backups_size(), 1);
  EXPECT_EQ(r.backups(0), c.member->member());
  EXPECT_GT(r.replicated_bytes(), 0);
  auto backup = admin.MemberStats(0, 2);
  ASSERT_TRUE(backup.ok()) << backup.status();
  EXPECT_EQ(backup->replica().role(), "backup");
  EXPECT_EQ(backup->replica().epoch(), r.epoch());
  EXPECT_EQ(backup->replica().applied_seq(), r.applied_seq());
  double backups = -1;
  for (const auto& family : StatsToMetrics(*stats)) {
    if (family.name == "asyncps_replica_backups") {
      backups = family.metric[0].gauge.value;
    }
  }
  EXPECT_EQ(backups, 1);
}

TEST_P(ReplicaTest, RestartedBackupCatchesUpAndSurvivesThePrimary) {
  workers_ = 2;  // Two clients of the job, below.
  Member& a = StartAs(Replication::Role::kPrimary);
  Member& b = StartAs(Replication::Role::kBackup);
  // The backup restarted below, at another address.
  Member& c = StartAs(Replication::Role::kBackup);
  auto client = DeclaredClient();
  ASSERT_FALSE(HasFailure());
  int pushed = 0;
  Push(client.get(), 5, &pushed);
  b.member->Kill();
  Push(client.get(), 5, &pushed);  // The group goes on with one backup.
  ExpectWeights(c, pushed);
  // b's replacement: copies the state mid-training.
  Member& d = StartAs(Replication::Role::kBackup);
  ASSERT_FALSE(HasFailure());
  Push(client.get(), 5, &pushed);
  ExpectWeights(d, pushed);
  c.member->Kill();
  a.member->Kill();  // Only d is left: it must be promoted.
  // A second worker (a client that knows d), rank 1: d knows rank 0's
  // registration, held by the first.
  auto survivor = DeclaredClient(1);
  ASSERT_FALSE(HasFailure());
  Push(survivor.get(), 5, &pushed, /*rank=*/1);
  EXPECT_TRUE(Is(d, Replication::Role::kPrimary));
  ExpectWeights(d, pushed);
}

TEST_P(ReplicaTest,
       PrimaryCutOffFromTheCoordinatorStopsBeforeABackupTakesOver) {
  Member& a = StartAs(Replication::Role::kPrimary);
  Member& b = StartAs(Replication::Role::kBackup);
  auto client = DeclaredClient();
  ASSERT_FALSE(HasFailure());
  int pushed = 0;
  Push(client.get(), 5, &pushed);
  // a keeps running but cannot renew its lease.
  Cut(a);
  Replication* ra = a.member->server()->replication();
  ASSERT_TRUE(WaitFor([&] { return !ra->CheckServing().ok(); }));
  Heal();
  ASSERT_TRUE(WaitFor([&] { return Is(b, Replication::Role::kPrimary); }));
  // a acknowledged nothing from its lease's end on, and b nothing before
  // it was promoted: the one ended before the other began.
  EXPECT_LT(ra->lease_deadline(),
            b.member->server()->replication()->promoted_at());
  EXPECT_TRUE(a.member->Ended(kWait));
  EXPECT_EQ(a.member->role(), Replication::Role::kFenced);
  // A client that only knows a gets nothing applied there.
  auto only_a = BriefClient(a);
  ASSERT_NE(only_a, nullptr);
  std::vector<SliceVersion> versions;
  std::vector<std::vector<float>> w = {std::vector<float>(3000),
                                       std::vector<float>(10)};
  EXPECT_FALSE(only_a->Pull(tensors_, &w, &versions, 0, 0).ok());
  Push(client.get(), 5, &pushed);
  ExpectWeights(b, pushed);
}

// Issue #40, "A minimum in sync" (--min_insync=2): the backup dies. The
// primary sees its stream end at once (it reads the backup's
// acknowledgements all the time) and refuses pushes before applying them
// (reads go on), until a new backup joined; then the client's retry is
// applied, once. (A backup that dies while a push streams, the push
// applied and not acknowledged: replication_test's
// BelowMinInsyncNothingOnlyThePrimaryHoldsIsAcknowledged.)
TEST_P(ReplicaTest, BelowMinInsyncAPushIsAcknowledgedOnlyOnceABackupHoldsIt) {
  min_insync_ = 2;
  workers_ = 2;  // Rank 1 is a client that gives up soon, below.
  Member& a = StartAs(Replication::Role::kPrimary);
  Member& b = StartAs(Replication::Role::kBackup);
  auto client = DeclaredClient();
  ASSERT_FALSE(HasFailure());
  int pushed = 0;
  Push(client.get(), 3, &pushed);
  b.member->Kill();
  Replication* ra = a.member->server()->replication();
  ASSERT_TRUE(WaitFor([&] { return ra->Stats().in_sync() == 1; }));
  int late = 0;
  std::atomic<bool> answered{false};
  std::thread pusher([&] {
    Push(client.get(), 1, &late);
    answered = true;
  });
  // Joined at the end, whatever fails first (a member joins to end it).
  absl::Cleanup finish = [&] {
    if (!answered) StartAs(Replication::Role::kBackup);
    pusher.join();
  };
  ASSERT_TRUE(WaitFor([&] { return ra->Stats().below_min_insync() > 0; }));
  EXPECT_FALSE(answered) << "a push only the primary holds was acknowledged";
  ExpectWeights(a, pushed);  // Refused before it was applied.
  {
    // A client that gives up soon hears why, and its push is not applied;
    // its pull is answered.
    auto brief = BriefClient(a);
    ASSERT_NE(brief, nullptr);
    ASSERT_TRUE(brief->FetchModel().ok());  // A declaration is a change.
    absl::Status joined = brief->Join(1, 2);
    ASSERT_TRUE(joined.ok()) << joined;
    std::vector<SliceVersion> versions;
    std::vector<std::vector<float>> w = {std::vector<float>(3000),
                                         std::vector<float>(10)};
    absl::Status pulled = brief->Pull(tensors_, &w, &versions, 1, 0);
    EXPECT_TRUE(pulled.ok()) << pulled;
    EXPECT_EQ(w[1][0], -static_cast<float>(pushed));
    PushStats r;
    absl::Status s = brief->Push(tensors_, g_, versions, 1, 1, &r);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("--min_insync=2"), absl::string_view::npos) << s;
    ExpectWeights(a, pushed);
  }
  auto stats = AdminClient(client->caller()).MemberStats(0, 0);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->replica().in_sync(), 1);
  EXPECT_EQ(stats->replica().min_insync(), 2);

  Member& c = StartAs(Replication::Role::kBackup);
  std::move(finish).Cancel();
  pusher.join();
  EXPECT_TRUE(answered);
  pushed += late;
  ASSERT_EQ(late, 1);
  ExpectWeights(a, pushed);
  ExpectWeights(c, pushed);
  EXPECT_EQ(ra->Stats().in_sync(), 2);
}

// Issue #40, "Only a member may join": a process listed as a member in the
// coordinator, with the workers' token in place of the members' (mutual
// TLS, the shards' certificate), or with the members' token but a worker's
// certificate (the CA signed it, so the connection is taken: a member
// presents the shards' own), gets no state; fails without either check.
TEST_P(ReplicaTest, AWorkersCredentialDoesNotJoinTheGroup) {
  if (!GetParam().tls) GTEST_SKIP() << "no credentials without TLS";
  Member& a = StartAs(Replication::Role::kPrimary);
  auto client = DeclaredClient();
  ASSERT_FALSE(HasFailure());
  auto rejected = [&] {
    auto stats = AdminClient(client->caller()).Stats(0);
    return stats.ok() ? stats->rejected_requests() : -1;
  };
  const std::string token = member_token_;
  for (const std::string posing : {"token", "certificate"}) {
    const int64_t before = rejected();
    member_token_ =
        posing == "token" ? "a-worker-posing-as-a-member-0123" : token;
    member_cert_ = posing == "token" ? "server" : "client";
    Member& m = Start();
    ASSERT_TRUE(WaitFor([&] { return rejected() > before; })) << posing;
    EXPECT_EQ(m.member->role(), Replication::Role::kJoining) << posing;
    EXPECT_FALSE(m.member->server()->store().declared()) << posing;
    EXPECT_EQ(a.member->server()->replication()->Stats().backups_size(), 0);
  }
  // A member with both joins as before.
  member_token_ = token;
  member_cert_ = "server";
  StartAs(Replication::Role::kBackup);
}

INSTANTIATE_TEST_SUITE_P(Coordinators, ReplicaTest,
                         ::testing::Values(Case{Transport::kTcp, false},
                                           Case{Transport::kGrpc, false},
                                           Case{Transport::kTcp, true},
                                           Case{Transport::kTcp, false, true},
                                           Case{Transport::kTcp, true, true}),
                         [](const auto& info) {
                           return absl::StrCat(
                               info.param.transport == Transport::kTcp ? "tcp"
                                                                       : "grpc",
                               info.param.etcd ? "_etcd" : "_memory",
                               info.param.tls ? "_tls" : "");
                         });

}  // namespace
}  // namespace asyncps::testing
