// A deposed primary changes nothing (issue #40, "Fenced coordinator
// writes"): real ps_server processes in a group of 3 with a private etcd.
// The primary is SIGSTOPped while it waits for a backup's acknowledgement
// of a push; the other backup, which acknowledged it, is promoted; the
// slow backup is killed; then the old primary is let go on. On waking it
// finds that backup gone and records its smaller set of backups in etcd.
// That write must be refused (it is a transaction on the primary key's
// revision, which is no longer its epoch): every value etcd's `insync` key
// held since the promotion names the new epoch. The push is answered once,
// by the new primary, and applied once.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "server/replica/etcd_coordinator.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/test_cluster.h"
#include "third_party/etcd/rpc.grpc.pb.h"

namespace asyncps::testing {
namespace {

constexpr int kMembers = 3;
const char kInsync[] = "/asyncps/test/shard/0/insync";
const char kPrimary[] = "/asyncps/test/shard/0/primary";

std::unique_ptr<PsClient> ClientOf(std::vector<ServerAddress> servers) {
  PsClientOptions options;
  options.servers = std::move(servers);
  options.rpc_timeout = absl::Seconds(2);
  options.backoff_initial = absl::Milliseconds(5);
  options.backoff_max = absl::Milliseconds(50);
  auto client = PsClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return client.ok() ? *std::move(client) : nullptr;
}

// The member of shard 0 whose address etcd's primary key names; -1 if none.
int PrimaryIndex(const TestCluster& cluster, Coordinator* etcd) {
  auto primary = etcd->Get(kPrimary);
  if (!primary.ok()) return -1;
  for (int m = 0; m < kMembers; ++m) {
    const ServerAddress a = cluster.MemberAddress(0, m);
    if (primary->value == absl::StrCat(a.host, ":", a.port)) return m;
  }
  return -1;
}

// "<epoch>:<backup>,..." as the epoch and the number of backups.
std::pair<int64_t, int> ParseInsync(const std::string& value) {
  std::pair<std::string, std::string> parts =
      absl::StrSplit(value, absl::MaxSplits(':', 1));
  int64_t epoch = -1;
  EXPECT_TRUE(absl::SimpleAtoi(parts.first, &epoch)) << value;
  int backups = 0;
  for (absl::string_view b : absl::StrSplit(parts.second, ',')) {
    if (!b.empty()) ++backups;
  }
  return {epoch, backups};
}

template <typename F>
bool WaitFor(F done, absl::Duration limit = absl::Seconds(30)) {
  const absl::Time give_up = absl::Now() + limit;
  while (absl::Now() < give_up) {
    if (done()) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return done();
}

// Every value `key` held from revision `from` to now (etcd keeps them
// until compacted; this etcd never compacts).
std::vector<std::string> History(const std::string& endpoint,
                                 const std::string& key, int64_t from) {
  auto kv = etcdserverpb::KV::NewStub(
      grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials()));
  auto range = [&](int64_t revision, etcdserverpb::RangeResponse* response) {
    grpc::ClientContext context;
    etcdserverpb::RangeRequest request;
    request.set_key(key);
    request.set_revision(revision);
    return kv->Range(&context, request, response);
  };
  etcdserverpb::RangeResponse now;
  EXPECT_TRUE(range(0, &now).ok());
  std::vector<std::string> values;
  for (int64_t r = from; r <= now.header().revision(); ++r) {
    etcdserverpb::RangeResponse at;
    EXPECT_TRUE(range(r, &at).ok()) << "revision " << r;
    // Written after `from` (the value at `from` may be older).
    if (at.kvs_size() == 1 && at.kvs(0).mod_revision() > from &&
        (values.empty() || values.back() != at.kvs(0).value())) {
      values.push_back(at.kvs(0).value());
    }
  }
  return values;
}

// Whether the member at `address` alone (a reader of it, not of its
// group) comes to hold the test's tensor at -1 within the wait.
bool HoldsMinusOne(const ServerAddress& address) {
  std::unique_ptr<PsClient> reader = ClientOf({address});
  if (reader == nullptr ||
      !reader->UseModel(ConstantSpec({{1000}}, 1, 0.0f, 1.0f, 4096)).ok()) {
    return false;
  }
  return WaitFor([&] {
    std::vector<std::vector<float>> seen = {std::vector<float>(1000)};
    std::vector<SliceVersion> v;
    return reader->Pull({0}, &seen, &v, -1, 0).ok() && seen[0][0] == -1.0f;
  });
}

TEST(ReplicaFencing, DeposedPrimaryWritesNothingAfterItsLease) {
  auto etcd_process = StartEtcd("etcd");
  ASSERT_TRUE(etcd_process.ok()) << etcd_process.status();
  // The primary waits for the stopped backup's acknowledgement for longer
  // than the test takes, so the wait spans its own deposition. The test's
  // client sends no heartbeats: the new primary takes its rank as
  // registered (--rejoin_grace).
  auto started = TestCluster::StartReplicated(
      1, kMembers, etcd_process->endpoint,
      {"--lease_ttl=1s", "--replica_ack_timeout=120s", "--rejoin_grace=1h"});
  ASSERT_TRUE(started.ok()) << started.status();
  TestCluster& cluster = **started;
  EtcdCoordinator etcd(etcd_process->endpoint);

  // Both backups in sync with the primary.
  int p = -1;
  ASSERT_TRUE(WaitFor([&] {
    p = PrimaryIndex(cluster, &etcd);
    auto insync = etcd.Get(kInsync);
    return p >= 0 && insync.ok() && ParseInsync(insync->value).second == 2;
  })) << "no primary with two backups in sync";
  const int64_t old_epoch = ParseInsync(etcd.Get(kInsync)->value).first;
  const int slow = (p + 1) % kMembers;
  const int next = (p + 2) % kMembers;

  std::unique_ptr<PsClient> client = ClientOf(cluster.servers());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Join(0, 1).ok());
  ASSERT_TRUE(
      client->DeclareModel(ConstantSpec({{1000}}, 1, 0.0f, 1.0f, 4096)).ok());
  std::vector<std::vector<float>> w = {std::vector<float>(1000)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(client->Pull({0}, &w, &versions, 0, 0).ok());

  // The push that spans the primary's deposition: applied by the primary,
  // acknowledged by `next`, waited for from `slow` (stopped).
  cluster.member(0, slow).Signal(SIGSTOP);
  absl::Status pushed;
  std::thread pusher([&] {
    PushStats r;
    const std::vector<std::vector<float>> g = {std::vector<float>(1000, 1.0f)};
    pushed = client->Push({0}, g, versions, 0, 1, &r);
  });
  // The primary applied it, so it now waits for `slow`.
  ASSERT_TRUE(HoldsMinusOne(cluster.MemberAddress(0, p)))
      << "the primary never applied the push";
  cluster.member(0, p).Signal(SIGSTOP);

  // Its lease runs out; `next`, in sync, is promoted.
  ASSERT_TRUE(WaitFor([&] { return PrimaryIndex(cluster, &etcd) == next; }))
      << "the in-sync backup was not promoted";
  const int64_t new_epoch = etcd.Get(kPrimary)->create_revision;
  ASSERT_GT(new_epoch, old_epoch);
  cluster.member(0, slow).Signal(SIGKILL);
  cluster.member(0, p).Signal(SIGCONT);

  pusher.join();
  EXPECT_TRUE(pushed.ok()) << pushed;
  // The old primary's process starts a fresh member, which joins the new
  // primary as a backup: the new primary records it (the new epoch).
  ASSERT_TRUE(WaitFor([&] {
    auto insync = etcd.Get(kInsync);
    return insync.ok() &&
           ParseInsync(insync->value) == std::make_pair(new_epoch, 1);
  })) << "the old primary's process never came back as a backup";

  for (const std::string& value :
       History(etcd_process->endpoint, kInsync, new_epoch)) {
    EXPECT_EQ(ParseInsync(value).first, new_epoch)
        << "insync was written as '" << value << "' after epoch " << new_epoch
        << " began: a write of the deposed primary got through";
  }
  // Applied once: the new primary holds -1.
  std::vector<std::vector<float>> after = {std::vector<float>(1000)};
  std::vector<SliceVersion> v;
  ASSERT_TRUE(client->Pull({0}, &after, &v, 0, 1).ok());
  EXPECT_EQ(after[0][0], -1.0f);
  EXPECT_EQ(after[0][999], -1.0f);
}

}  // namespace
}  // namespace asyncps::testing
