// The fixture of tests/integration/replica_test.cc: a group of replicated
// members in process (server/replica/replica_member.h), coordinated by the
// in-memory coordinator or a private etcd, and a client pushing gradient 1
// with SGD at learning rate 1 through them.
#ifndef ASYNCPS_TESTS_INTEGRATION_REPLICA_FIXTURE_H_
#define ASYNCPS_TESTS_INTEGRATION_REPLICA_FIXTURE_H_

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

struct Case {
  Transport transport;
  bool etcd;         // A real etcd, else the in-memory coordinator.
  bool tls = false;  // Mutual TLS and a token, between members too.
};

// etcd grants whole seconds only.
inline absl::Duration Ttl(bool etcd) {
  return etcd ? absl::Seconds(1) : absl::Milliseconds(400);
}
inline constexpr absl::Duration kWait = absl::Seconds(20);

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
    if (!GetParam().etcd) {
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
    // With etcd, as ps_server does: a start that cannot reach it yet (a
    // loaded machine's TLS handshake with the etcd just started) is tried
    // again, through a new channel.
    const absl::Time until = absl::Now() + kWait;
    absl::StatusOr<std::unique_ptr<ReplicaMember>> started;
    for (bool first = true;; first = false) {
      if (!first) absl::SleepFor(absl::Milliseconds(100));  // Backoff.
      if (GetParam().etcd) {
        m.coordinator = std::make_unique<EtcdCoordinator>(
            etcd_.endpoint, absl::Seconds(2), etcd_.tls);
      }
      started = ReplicaMember::Start(c, rc, m.coordinator.get());
      if (!GetParam().etcd || !absl::IsUnavailable(started.status()) ||
          absl::Now() > until) {
        break;
      }
    }
    EXPECT_TRUE(started.ok()) << started.status();
    if (started.ok()) m.member = *std::move(started);
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
    if (rank >= 0) {
      EXPECT_TRUE((*client)->Join(rank, workers_).ok());
    }
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

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_REPLICA_FIXTURE_H_
