// Replicated shards (server/replica/replica_member.h), in process over real
// sockets, coordinated by the in-memory coordinator or by a real etcd (a
// private etcd-server process per test): a client pushes a known gradient
// stream with SGD (weights 0, learning rate 1, gradient 1: every weight is
// exactly minus the pushes applied) through a group of members while members
// die. Afterwards every member's weights equal minus the number of acknowledged
// pushes, exactly: nothing acknowledged was lost, nothing applied twice.
#include <atomic>
#include <csignal>
#include <cstring>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "server/edge/metrics.h"
#include "server/replica/etcd_coordinator.h"
#include "server/replica/replica_member.h"
#include "server/replica/testing/memory_coordinator.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/test_cluster.h"
#include "tests/testing/certs.h"

namespace asyncps::testing {
namespace {

struct Case {
  Transport transport;
  bool etcd;         // A real etcd, else the in-memory coordinator.
  bool tls = false;  // Mutual TLS and a token, between members too.
};

// etcd grants whole seconds only.
absl::Duration Ttl(bool etcd) {
  return etcd ? absl::Seconds(1) : absl::Milliseconds(400);
}
constexpr absl::Duration kWait = absl::Seconds(20);

// Polls `done` until it holds or kWait passes.
template <typename F>
bool WaitFor(F done) {
  const absl::Time until = absl::Now() + kWait;
  while (!done()) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

class ReplicaTest : public ::testing::TestWithParam<Case> {
 protected:
  struct Member {
    std::unique_ptr<Coordinator> coordinator;
    MemoryCoordinator::View* view = nullptr;  // In memory only.
    std::unique_ptr<ReplicaMember> member;
  };

  void SetUp() override {
    if (GetParam().tls) certs_ = MakeCerts("certs");
    if (!GetParam().etcd) return;
    // With TLS, etcd's client port is TLS too (--etcd_tls_*).
    auto etcd = StartEtcd("etcd", 0, certs_);
    ASSERT_TRUE(etcd.ok()) << etcd.status();
    etcd_ = *std::move(etcd);
  }

  Member& Start() {
    Member& m = members_.emplace_back();
    if (GetParam().etcd) {
      m.coordinator = std::make_unique<EtcdCoordinator>(
          etcd_.endpoint, absl::Seconds(2), etcd_.tls);
    } else {
      auto view = coordinator_.NewView();
      m.view = view.get();
      m.coordinator = std::move(view);
    }
    ShardServerConfig c;
    c.host = "127.0.0.1";
    // No --rejoin_grace: a promoted member knows the workers' registrations
    // (the membership is replicated).
    if (GetParam().tls) c.security = LoadCerts(certs_, member_cert_);
    c.min_insync = min_insync_;
    if (GetParam().tls) c.security.member_token = member_token_;
    ReplicaConfig rc;
    rc.prefix = "/test";
    rc.lease_ttl = Ttl(GetParam().etcd);
    rc.poll = rc.watched_poll = absl::Milliseconds(10);
    rc.bootstrap = true;  // The test's groups are new.
    auto started = ReplicaMember::Start(c, rc, m.coordinator.get());
    EXPECT_TRUE(started.ok()) << started.status();
    m.member = *std::move(started);
    return m;
  }

  // A member started and waited for until it has `role`.
  Member& StartAs(Replication::Role role) {
    Member& m = Start();
    EXPECT_TRUE(WaitFor([&] { return Is(m, role); }))
        << m.member->member() << " never became "
        << Replication::RoleName(role);
    // A backup is in sync (changes wait for it) once the primary counts it
    // in: after the snapshot's acknowledgement and the ops streamed since.
    if (role == Replication::Role::kBackup) {
      EXPECT_TRUE(WaitFor([&] { return InSync(m); }))
          << m.member->member() << " never in sync";
    }
    return m;
  }

  // True if a primary lists `m` among its backups in sync.
  bool InSync(Member& m) {
    for (Member& p : members_) {
      if (&p == &m || p.member->server() == nullptr ||
          !Is(p, Replication::Role::kPrimary)) {
        continue;  // (A member whose start failed has no server.)
      }
      const v1::ReplicaStats stats = p.member->server()->replication()->Stats();
      for (const std::string& b : stats.backups()) {
        if (b == m.member->member()) return true;
      }
    }
    return false;
  }

  static bool Is(Member& m, Replication::Role role) {
    return m.member->role() == role;
  }

  // The group's address as a client lists it: every member, live or not.
  ServerAddress Group() {
    ServerAddress group;
    for (Member& m : members_) {
      ServerAddress a{"127.0.0.1", m.member->server()->port(), {}};
      if (group.port == 0) {
        group = a;
      } else {
        group.others.push_back(a);
      }
    }
    return group;
  }

  // A client of `group`, joined as `rank` (-1: not joined, a viewer; a
  // rank's registration is held by its live worker, and a promoted member
  // knows it, so a second client of the job takes another rank).
  std::unique_ptr<PsClient> Client(const ServerAddress& group, int rank = 0) {
    PsClientOptions options;
    options.servers = {group};
    options.transport = GetParam().transport;
    if (GetParam().tls) options.security = LoadCerts(certs_, "client");
    options.backoff_initial = absl::Milliseconds(5);
    options.backoff_max = absl::Milliseconds(50);
    options.rpc_timeout = absl::Seconds(5);
    auto client = PsClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    if (rank >= 0) EXPECT_TRUE((*client)->Join(rank, workers_).ok());
    return *std::move(client);
  }
  // A client of member `m` alone that gives up after 300 ms of retries.
  std::unique_ptr<PsClient> BriefClient(Member& m) {
    PsClientOptions options;
    options.servers = {
        ServerAddress{"127.0.0.1", m.member->server()->port(), {}}};
    options.transport = GetParam().transport;
    if (GetParam().tls) options.security = LoadCerts(certs_, "client");
    options.retry_for = absl::Milliseconds(300);
    auto client = PsClient::Create(options);
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }
  // A client of the whole group, with the test's model declared (weights
  // 0, SGD at learning rate 1).
  std::unique_ptr<PsClient> DeclaredClient(int rank = 0) {
    auto client = Client(Group(), rank);
    EXPECT_TRUE(
        client
            ->DeclareModel(ConstantSpec({{300, 10}, {10}}, 1, 0.0f, 1.0f, 1024))
            .ok());
    return client;
  }

  // Every weight of `m`'s store (its snapshot's slices), expected to be
  // exactly -pushes.
  static void ExpectWeights(Member& m, int pushes) {
    auto snapshot = m.member->server()->store().Snapshot();
    ASSERT_TRUE(snapshot.ok()) << snapshot.status();
    for (const v1::SliceCheckpoint& s : snapshot->slices()) {
      const std::string& bytes = s.weights();
      std::vector<float> w(bytes.size() / sizeof(float));
      std::memcpy(w.data(), bytes.data(), bytes.size());
      for (float x : w) {
        ASSERT_EQ(x, -static_cast<float>(pushes))
            << "member " << m.member->member() << " slice " << s.slice();
      }
      EXPECT_EQ(s.version(), pushes);
    }
  }

  // Cuts `m` off from the coordinator: the in-memory one refuses its
  // calls; etcd is stopped (SIGSTOP) for everyone. Heal ends it.
  void Cut(Member& m) {
    if (GetParam().etcd) {
      etcd_.process->Signal(SIGSTOP);
    } else {
      m.view->set_cut(true);
    }
  }
  void Heal() {
    if (GetParam().etcd) etcd_.process->Signal(SIGCONT);
  }

  int min_insync_ = 1;  // For the members started from now on.
  // The certificate a member started next presents (tests/testing/certs.h).
  std::string member_cert_ = "server";
  int workers_ = 1;  // The job's, as Client() joins it.
  std::string member_token_ = "the-members-own-token-0123456789";
  std::string certs_;
  EtcdProcess etcd_;
  MemoryCoordinator coordinator_;
  std::deque<Member> members_;
  const std::vector<int> tensors_ = {0, 1};
  const std::vector<std::vector<float>> g_ = {std::vector<float>(3000, 1.0f),
                                              std::vector<float>(10, 1.0f)};

  // Pushes gradient 1 `n` times as `rank`; each must be acknowledged.
  void Push(PsClient* client, int n, int* pushed, int rank = 0) {
    std::vector<SliceVersion> versions;
    std::vector<std::vector<float>> w = {std::vector<float>(3000),
                                         std::vector<float>(10)};
    absl::Status pulled = client->Pull(tensors_, &w, &versions, rank, 0);
    ASSERT_TRUE(pulled.ok()) << pulled;
    for (int i = 0; i < n; ++i) {
      PushStats r;
      absl::Status s = client->Push(tensors_, g_, versions, rank, 1, &r);
      ASSERT_TRUE(s.ok()) << s;
      ++*pushed;
    }
  }
};

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
  for (const std::string& posing : {"token", "certificate"}) {
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
