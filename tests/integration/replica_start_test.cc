// Issue #38: a replicated member whose start failed before its ShardServer
// existed (etcd not up yet, as when tools/reliability/chaos.py starts etcd
// and the
// first member together; its port taken) died of SIGSEGV in
// ~ReplicaMember (Stop fenced a server that was never made) instead of
// returning the error, so ps_server never tried again. In process, each
// such failure is an error; and, the loop that found it kept short,
// groups whose first member starts before etcd all serve once etcd is up.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/replica/etcd_coordinator.h"
#include "server/replica/group_records.h"
#include "server/replica/replica_member.h"
#include "server/replica/testing/memory_coordinator.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/subprocess.h"
#include "tests/testing/certs.h"

namespace asyncps::testing {
namespace {

ShardServerConfig MemberConfig() {
  ShardServerConfig c;
  c.host = "127.0.0.1";
  return c;
}

TEST(ReplicaMemberStart, CoordinatorOutOfReachIsAnError) {
  MemoryCoordinator coordinator;
  auto view = coordinator.NewView();
  view->set_cut(true);
  auto m = ReplicaMember::Start(MemberConfig(), ReplicaConfig(), view.get());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kUnavailable) << m.status();
}

TEST(ReplicaMemberStart, EtcdNotUpYetIsAnError) {
  EtcdCoordinator etcd(absl::StrCat("127.0.0.1:", FreePort()),
                       absl::Milliseconds(500));
  auto m = ReplicaMember::Start(MemberConfig(), ReplicaConfig(), &etcd);
  EXPECT_FALSE(m.ok());
}

TEST(ReplicaMemberStart, PortTakenIsAnError) {
  // Listening without SO_REUSEPORT: gRPC cannot bind beside it.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), len), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  ShardServerConfig c = MemberConfig();
  c.port = ntohs(a.sin_port);
  MemoryCoordinator coordinator;
  auto view = coordinator.NewView();
  ReplicaConfig rc;
  rc.bootstrap = true;
  auto m = ReplicaMember::Start(c, rc, view.get());
  EXPECT_FALSE(m.ok());
  EXPECT_NE(m.status().code(), absl::StatusCode::kFailedPrecondition)
      << m.status();
  close(fd);
}

// A group is created once, explicitly (issue #40): a member of a group
// with no records does not start, and says how to create it; --bootstrap
// (or psctl group init) creates them once.
TEST(ReplicaMemberStart, NoMemberStartsInAGroupNoOneCreated) {
  MemoryCoordinator coordinator;
  auto view = coordinator.NewView();
  auto refused =
      ReplicaMember::Start(MemberConfig(), ReplicaConfig(), view.get());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition)
      << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "--bootstrap"));
  EXPECT_TRUE(
      absl::StrContains(refused.status().message(), "psctl group init"));
  EXPECT_TRUE(
      absl::IsNotFound(view->Get("/asyncps/default/shard/0/insync").status()));

  auto created = CreateGroup(view.get(), "/asyncps/default", 0);
  ASSERT_TRUE(created.ok()) << created.status();
  EXPECT_TRUE(*created);
  auto again = CreateGroup(view.get(), "/asyncps/default", 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(*again);  // It has them: nothing changes.
  auto m = ReplicaMember::Start(MemberConfig(), ReplicaConfig(), view.get());
  EXPECT_TRUE(m.ok()) << m.status();
}

// The loop that found it, short: a group's first member started before its
// etcd (chaos.py starts etcd and at once the members), then the rest. The
// first member's start fails (etcd refuses the connection) and is tried
// again; every member serves, and exits 0 at SIGTERM. A few rounds, etcd
// later each time, each with its own etcd.
TEST(ReplicaMemberStart, MembersStartedBeforeEtcdServeOnceItIs) {
  for (int round = 0; round < 3; ++round) {
    const int client_port = FreePort();
    std::vector<std::string> flags = {
        "--replicas=2", absl::StrCat("--etcd=127.0.0.1:", client_port),
        "--job=start", "--mode=bsp", "--worker_timeout=3s"};
    EtcdProcess etcd;  // Outlives the members.
    std::vector<std::unique_ptr<Subprocess>> members;
    for (int m = 0; m < 2; ++m) {
      const int port = FreePort();
      std::vector<std::string> argv = {
          RunfilePath("server/ps_server"),
          "--host=127.0.0.1",
          absl::StrCat("--port=", port),
          "--shard=0",
          "--num_shards=1",
          absl::StrCat("--advertise=127.0.0.1:", port)};
      argv.insert(argv.end(), flags.begin(), flags.end());
      if (m == 0) argv.push_back("--bootstrap");
      const std::string ready = UniqueTempPath("ready", ".json");
      argv.push_back("--ready_file=" + ready);
      // Forked by this thread: a child dies with the thread that forked it
      // (PR_SET_PDEATHSIG).
      auto p = Subprocess::Start(argv);
      ASSERT_TRUE(p.ok()) << p.status();
      if (m == 0) {
        // The order under test, not a wait for anything: etcd comes late.
        absl::SleepFor(absl::Milliseconds(200 + 400 * round));
        auto started = StartEtcd(absl::StrCat("etcd", round), client_port);
        ASSERT_TRUE(started.ok()) << started.status();
        etcd = *std::move(started);
      }
      auto served = (*p)->WaitForFile(ready, absl::Seconds(20));
      ASSERT_TRUE(served.ok())
          << "round " << round << ", member " << m << ": " << served.status();
      members.push_back(*std::move(p));
    }
    for (size_t m = 0; m < members.size(); ++m) {
      members[m]->Signal(SIGTERM);
      const int status = members[m]->Wait(absl::Seconds(30));
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
          << "round " << round << ": member " << m << " ended with wait status "
          << status;
    }
  }
}

// psctl group init, as a launcher runs it (docs/DEPLOY.md): members of a
// job with no group records wait for them; once psctl created them, the
// members start and elect a primary; run again, psctl changes nothing.
// With `certs`, etcd's client port is TLS asking for a client certificate
// (issue #40), and ps_server and psctl reach it with --etcd_tls_*.
void GroupInitLetsTheMembersStart(const std::string& name,
                                  const std::string& certs) {
  auto etcd = StartEtcd(name, 0, certs);
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  std::vector<std::string> tls;
  if (!certs.empty()) {
    tls = {"--etcd_tls_ca=" + certs + "/ca.pem",
           "--etcd_tls_cert=" + certs + "/client.pem",
           "--etcd_tls_key=" + certs + "/client.key"};
  }
  const int port = FreePort();
  const std::string ready = UniqueTempPath("ready", ".json");
  std::vector<std::string> argv = {RunfilePath("server/ps_server"),
                                   "--host=127.0.0.1",
                                   absl::StrCat("--port=", port),
                                   "--shard=0",
                                   "--num_shards=1",
                                   absl::StrCat("--advertise=127.0.0.1:", port),
                                   "--replicas=2",
                                   "--etcd=" + etcd->endpoint,
                                   "--job=init",
                                   "--ready_file=" + ready};
  argv.insert(argv.end(), tls.begin(), tls.end());
  auto member = Subprocess::Start(argv);
  ASSERT_TRUE(member.ok()) << member.status();
  auto init = [&](const std::vector<std::string>& flags, int expect) {
    std::vector<std::string> psctl_argv = {
        RunfilePath("tools/psctl"), "group",      "init",
        "--etcd=" + etcd->endpoint, "--job=init", "--num_shards=1",
        "--etcd_timeout=2s"};
    psctl_argv.insert(psctl_argv.end(), flags.begin(), flags.end());
    auto psctl = Subprocess::Start(psctl_argv);
    EXPECT_TRUE(psctl.ok()) << psctl.status();
    const int status = (*psctl)->Wait(absl::Seconds(30));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == expect) << status;
    return (*psctl)->output();
  };
  if (!certs.empty()) {
    // Without the client certificate etcd answers no one.
    init({}, 1);
    EXPECT_FALSE(EtcdCoordinator(etcd->endpoint, absl::Milliseconds(500))
                     .Get("/asyncps/init/shard/0/insync")
                     .ok());
    EtcdTls ca_only = etcd->tls;
    ca_only.cert_pem = ca_only.key_pem = "";
    EXPECT_FALSE(
        EtcdCoordinator(etcd->endpoint, absl::Milliseconds(500), ca_only)
            .Get("/asyncps/init/shard/0/insync")
            .ok());
  }
  EXPECT_TRUE(absl::StrContains(init(tls, 0), "shard 0: group created"));
  auto served = (*member)->WaitForFile(ready, absl::Seconds(30));
  ASSERT_TRUE(served.ok()) << served.status();
  EtcdCoordinator coordinator(etcd->endpoint, absl::Seconds(2), etcd->tls);
  auto primary = coordinator.Get("/asyncps/init/shard/0/primary");
  for (int i = 0; i < 300 && !primary.ok(); ++i) {
    absl::SleepFor(absl::Milliseconds(20));
    primary = coordinator.Get("/asyncps/init/shard/0/primary");
  }
  ASSERT_TRUE(primary.ok()) << primary.status();
  EXPECT_EQ(primary->value, absl::StrCat("127.0.0.1:", port));
  EXPECT_TRUE(absl::StrContains(init(tls, 0), "has its records already"));
  (*member)->Signal(SIGTERM);
  EXPECT_NE((*member)->Wait(absl::Seconds(30)), -1);
}

TEST(ReplicaMemberStart, PsctlGroupInitLetsTheMembersStart) {
  GroupInitLetsTheMembersStart("etcd-init", "");
}

TEST(ReplicaMemberStart, MembersAndPsctlReachEtcdOverTls) {
  GroupInitLetsTheMembersStart("etcd-tls", MakeCerts("certs"));
}

}  // namespace
}  // namespace asyncps::testing
