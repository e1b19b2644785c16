// Authorization with real ps_server processes: a rank is bound to its
// registration by a secret, so another client cannot push, pull or
// heartbeat as it, nor take its place while it lives; a flood of
// registrations cannot grow the job; only the job's workers declare and
// assign and write the rendezvous store; only an operator with the admin
// token checkpoints or pauses the job, for a bounded lease; a model too
// large or cut absurdly is refused at once. Every refusal has its own
// status and message, and no weight moves.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "common/security.h"
#include "gtest/gtest.h"
#include "tests/integration/test_cluster.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

std::unique_ptr<PsClient> Client(const TestCluster& cluster,
                                 Transport transport = Transport::kGrpc,
                                 absl::Duration retry_for = absl::Seconds(5),
                                 const Security& security = {}) {
  PsClientOptions options;
  options.security = security;
  options.servers = cluster.servers();
  options.transport = transport;
  options.rpc_timeout = absl::Seconds(10);
  options.retry_for = retry_for;
  options.backoff_initial = absl::Milliseconds(5);
  options.backoff_max = absl::Milliseconds(50);
  auto client = PsClient::Create(options);
  EXPECT_TRUE(client.ok()) << client.status();
  return *std::move(client);
}

// A client that gives up at the first refusal (no retries).
std::unique_ptr<PsClient> Stranger(const TestCluster& cluster,
                                   Transport transport = Transport::kGrpc) {
  return Client(cluster, transport, absl::ZeroDuration());
}

// Every weight of `spec`, pulled as no rank (reads are open to the job).
std::vector<std::vector<float>> Weights(const TestCluster& cluster,
                                        const v1::ModelSpec& spec) {
  auto reader = Client(cluster);
  EXPECT_TRUE(reader->UseModel(spec).ok());
  std::vector<int> all;
  std::vector<std::vector<float>> w;
  for (int t = 0; t < spec.tensors_size(); ++t) {
    all.push_back(t);
    w.emplace_back(reader->partition().tensor_elements(t));
  }
  std::vector<SliceVersion> versions;
  absl::Status s = reader->Pull(all, &w, &versions, -1, 0);
  EXPECT_TRUE(s.ok()) << s;
  return w;
}

void ExpectRefused(const absl::Status& s, absl::StatusCode code,
                   absl::string_view says, absl::string_view what) {
  EXPECT_EQ(s.code(), code) << what << ": " << s;
  EXPECT_NE(s.message().find(std::string(says)), std::string::npos)
      << what << ": '" << s.message() << "' lacks '" << says << "'";
}

class SpoofedRank : public ::testing::TestWithParam<Transport> {};

TEST_P(SpoofedRank, CannotActAsARegisteredWorker) {
  // No grace for unregistered ranks: this shard did not restart.
  auto cluster =
      TestCluster::Start(1, {"--worker_timeout=60s", "--rejoin_grace=0s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const v1::ModelSpec spec = ConstantSpec({{8, 4}}, 1, 1.0f, 0.5f, 64);
  auto owner = Client(**cluster, GetParam());
  ASSERT_TRUE(owner->Join(0, 2).ok());
  ASSERT_TRUE(owner->DeclareModel(spec).ok());
  const auto before = Weights(**cluster, spec);
  auto stats = AdminClient(owner->caller()).Stats(0);
  ASSERT_TRUE(stats.ok() && stats->workers_size() == 1);
  const int64_t incarnation = stats->workers(0).incarnation();

  auto intruder = Stranger(**cluster, GetParam());
  ASSERT_TRUE(intruder->UseModel(spec).ok());
  std::vector<std::vector<float>> grads = {std::vector<float>(32, 1.0f)};
  std::vector<std::vector<float>> w = before;
  std::vector<SliceVersion> versions(intruder->partition().slices().size());
  const absl::StatusCode denied = absl::StatusCode::kPermissionDenied;
  ExpectRefused(intruder->Push({0}, grads, versions, 0, 1, nullptr), denied,
                "without the secret", "push as rank 0");
  ExpectRefused(
      intruder->PushPull({0}, grads, versions, 0, 1, &w, &versions, nullptr),
      denied, "without the secret", "push-pull as rank 0");
  ExpectRefused(intruder->Pull({0}, &w, &versions, 0, 1), denied,
                "without the secret", "pull as rank 0");
  ExpectRefused(intruder->Assign({0}, grads, 5, 0), denied,
                "without the secret", "assign as rank 0");
  ExpectRefused(intruder->Push({0}, grads, versions, -1, 1, nullptr), denied,
                "only a registered worker", "push as no rank");
  ExpectRefused(intruder->Push({0}, grads, versions, 1, 1, nullptr),
                absl::StatusCode::kUnavailable, "has not registered",
                "push as rank 1, which no one holds");
  // Nor may it take rank 0 while rank 0 lives, or heartbeat for it.
  v1::RegisterRequest take;
  take.set_rank(0);
  take.set_num_workers(2);
  ExpectRefused(intruder->caller()->Register(0, take).status(),
                absl::StatusCode::kUnavailable, "held by a live worker",
                "register as live rank 0");
  v1::HeartbeatRequest beat;
  beat.set_rank(0);
  beat.set_incarnation(incarnation);
  beat.set_leaving(true);  // Would free the rank for the taking.
  ShardCall<v1::HeartbeatRequest, v1::HeartbeatResponse> heartbeat;
  heartbeat.request = beat;
  ExpectRefused(intruder->caller()
                    ->GrpcAttempt<v1::HeartbeatRequest, v1::HeartbeatResponse>(
                        {&heartbeat}, ASYNCPS_RPC(Heartbeat))[0],
                denied, "secret", "heartbeat as rank 0");
  EXPECT_EQ(Weights(**cluster, spec), before) << "a refused call moved them";
  stats = AdminClient(owner->caller()).Stats(0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->live_workers(), 1);
  EXPECT_GE(stats->rejected_requests(), 8);

  // The owner itself is served as before (so the refusals above were
  // about who asked, not what).
  versions.clear();
  ASSERT_TRUE(owner->Pull({0}, &w, &versions, 0, 0).ok());
  ASSERT_TRUE(owner->Push({0}, grads, versions, 0, 1, nullptr).ok());
  EXPECT_EQ(Weights(**cluster, spec)[0][0], 0.5f);
}

INSTANTIATE_TEST_SUITE_P(Transports, SpoofedRank,
                         ::testing::Values(Transport::kTcp, Transport::kGrpc),
                         [](const auto& info) {
                           return info.param == Transport::kTcp ? "Tcp"
                                                                : "Grpc";
                         });

TEST(Registration, AFloodCannotGrowOrStallTheJob) {
  auto cluster = TestCluster::Start(
      1, {"--mode=bsp", "--num_workers=2", "--worker_timeout=60s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const v1::ModelSpec spec = ConstantSpec({{16}}, 1, 1.0f, 0.5f, 1024);
  std::vector<std::unique_ptr<PsClient>> workers;
  for (int r = 0; r < 2; ++r) {
    workers.push_back(Client(**cluster));
    ASSERT_TRUE(workers[r]->Join(r, 2).ok());
  }
  ASSERT_TRUE(workers[0]->DeclareModel(spec).ok());
  ASSERT_TRUE(workers[1]->DeclareModel(spec).ok());

  auto flood = Stranger(**cluster);
  struct Wave {
    int rank, num_workers;
    absl::StatusCode code;
  };
  int sent = 0;
  for (int i = 0; i < 100; ++i) {
    for (const Wave& w :
         {Wave{i % 2, 60000, absl::StatusCode::kFailedPrecondition},
          Wave{i, 1000 + i, absl::StatusCode::kFailedPrecondition},
          Wave{i % 2, 2, absl::StatusCode::kUnavailable},
          Wave{-1, 2, absl::StatusCode::kResourceExhausted},
          Wave{2 + i, 2, absl::StatusCode::kInvalidArgument}}) {
      v1::RegisterRequest join;
      join.set_rank(w.rank);
      join.set_num_workers(w.num_workers);
      auto r = flood->caller()->Register(0, join);
      ASSERT_EQ(r.status().code(), w.code)
          << "rank " << w.rank << " of " << w.num_workers << ": " << r.status();
      ++sent;
    }
  }
  EXPECT_EQ(sent, 500);
  auto stats = AdminClient(workers[0]->caller()).Stats(0);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->workers_size(), 2);
  EXPECT_EQ(stats->live_workers(), 2);
  // The job's two workers still make a bsp step: it waits for no one else.
  std::vector<std::vector<float>> grads = {std::vector<float>(16, 1.0f)};
  for (int r = 0; r < 2; ++r) {
    std::vector<SliceVersion> versions;
    std::vector<std::vector<float>> w = {std::vector<float>(16)};
    ASSERT_TRUE(workers[r]->Pull({0}, &w, &versions, r, 0).ok());
    ASSERT_TRUE(workers[r]->Push({0}, grads, versions, r, 1, nullptr).ok());
  }
  std::vector<std::vector<float>> w = {std::vector<float>(16)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(workers[0]->Pull({0}, &w, &versions, 0, 1).ok());  // Held.
  EXPECT_EQ(versions[0].version, 1);
  EXPECT_EQ(w[0][0], 0.5f);  // 1 - 0.5 * mean(1, 1).
}

TEST(Roles, OnlyTheJobsWorkersDeclareAndAssign) {
  auto cluster =
      TestCluster::Start(1, {"--mode=allreduce", "--rejoin_grace=0s"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const v1::ModelSpec spec = ConstantSpec({{4, 4}}, 1, 1.0f, 0.5f, 1024);
  auto stranger = Stranger(**cluster);
  ExpectRefused(stranger->DeclareModel(spec),
                absl::StatusCode::kPermissionDenied,
                "only a registered worker of the job declares the model",
                "a stranger's declare");
  // Nothing was declared: the model is still to be made.
  EXPECT_EQ(Stranger(**cluster)->FetchModel().code(),
            absl::StatusCode::kFailedPrecondition);

  // Any worker of the job may make it (workers start in any order).
  auto worker = Client(**cluster);
  ASSERT_TRUE(worker->Join(1, 2).ok());
  ASSERT_TRUE(worker->DeclareModel(spec).ok());
  // Declaring the same spec again creates nothing: anyone may check it.
  EXPECT_TRUE(stranger->DeclareModel(spec).ok());
  const auto before = Weights(**cluster, spec);

  std::vector<std::vector<float>> sevens = {std::vector<float>(16, 7.0f)};
  ExpectRefused(stranger->Assign({0}, sevens, 3, 1),
                absl::StatusCode::kPermissionDenied, "without the secret",
                "a stranger's assign as worker 1");
  ExpectRefused(stranger->Assign({0}, sevens, 3, -1),
                absl::StatusCode::kPermissionDenied, "only a registered worker",
                "a stranger's assign as no rank");
  ExpectRefused(stranger->Assign({0}, sevens, 3, 0),
                absl::StatusCode::kUnavailable, "has not registered",
                "a stranger's assign as rank 0, which no one holds");
  EXPECT_EQ(Weights(**cluster, spec), before);
  ASSERT_TRUE(worker->Assign({0}, sevens, 3, 1).ok());
  EXPECT_EQ(Weights(**cluster, spec), sevens);
}

// Checkpoint (a shard's file now, a job checkpoint's PAUSE, WRITE and
// RESUME) belongs to operators: with a workers' token it needs the admin
// token apart from it, a PAUSE lease is bounded, and a shard with a token
// but no admin token refuses it outright.
TEST(Roles, OnlyAnOperatorCheckpointsOrPausesTheJob) {
  const std::string dir = FreshTempDir("admin");
  const std::string token = dir + "/token", admin = dir + "/admin";
  ASSERT_TRUE(WriteFile(token, "workers-token-0123456789abcdef\n"));
  ASSERT_TRUE(WriteFile(admin, "operators-token-0123456789abcdef\n"));
  SecurityFlags same;
  same.auth_token_file = same.admin_token_file = token;
  ExpectRefused(LoadSecurity(same).status(), absl::StatusCode::kInvalidArgument,
                "apart from the workers'", "one file for both tokens");
  SecurityFlags worker_flags, operator_flags;
  worker_flags.auth_token_file = operator_flags.auth_token_file = token;
  operator_flags.admin_token_file = admin;
  auto worker_security = LoadSecurity(worker_flags);
  auto operator_security = LoadSecurity(operator_flags);
  ASSERT_TRUE(worker_security.ok() && operator_security.ok());

  auto cluster = TestCluster::Start(
      1, {"--auth_token_file=" + token, "--admin_token_file=" + admin,
          "--checkpoint_dir=" + dir});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const v1::ModelSpec spec = ConstantSpec({{4, 4}}, 1, 1.0f, 0.5f, 1024);
  auto worker = Client(**cluster, Transport::kGrpc, absl::ZeroDuration(),
                       *worker_security);
  ASSERT_TRUE(worker->Join(0, 1).ok());
  ASSERT_TRUE(worker->DeclareModel(spec).ok());
  AdminClient as_worker(worker->caller());
  ExpectRefused(as_worker.Checkpoint(0).status(),
                absl::StatusCode::kPermissionDenied, "needs the admin token",
                "a worker's checkpoint");
  ExpectRefused(as_worker.JobCheckpoint("w").status(),
                absl::StatusCode::kPermissionDenied, "needs the admin token",
                "a worker's job checkpoint (PAUSE)");
  // Nothing was paused: the worker's push still applies.
  std::vector<std::vector<float>> w = {std::vector<float>(16)};
  std::vector<SliceVersion> versions;
  ASSERT_TRUE(worker->Pull({0}, &w, &versions, 0, 0).ok());
  const std::vector<std::vector<float>> ones = {std::vector<float>(16, 1.0f)};
  PushStats pushed;
  ASSERT_TRUE(worker->Push({0}, ones, versions, 0, 0, &pushed).ok());
  EXPECT_EQ(pushed.dropped, 0);

  auto op =
      Client(**cluster, Transport::kGrpc, absl::Seconds(5), *operator_security);
  AdminClient as_operator(op->caller());
  ExpectRefused(as_operator.JobCheckpoint("long", absl::Minutes(10)).status(),
                absl::StatusCode::kInvalidArgument, "is outside [0, 300000]",
                "a ten-minute pause");
  auto path = as_operator.Checkpoint(0);
  EXPECT_TRUE(path.ok()) << path.status();
  auto paths = as_operator.JobCheckpoint("ok");
  EXPECT_TRUE(paths.ok()) << paths.status();

  auto no_admin = TestCluster::Start(
      1, {"--auth_token_file=" + token, "--checkpoint_dir=" + dir});
  ASSERT_TRUE(no_admin.ok()) << no_admin.status();
  auto op2 = Client(**no_admin, Transport::kGrpc, absl::ZeroDuration(),
                    *operator_security);
  ExpectRefused(AdminClient(op2->caller()).Checkpoint(0).status(),
                absl::StatusCode::kPermissionDenied, "no --admin_token_file",
                "a checkpoint where the shard has no admin token");
}

TEST(Limits, AModelTooLargeOrCutAbsurdlyIsRefusedAtOnce) {
  auto cluster = TestCluster::Start(1, {"--max_shard_bytes=1048576"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto worker = Client(**cluster);
  ASSERT_TRUE(worker->Join(0, 1).ok());
  // 4 MiB of weights on a shard that may hold 1 MiB.
  const absl::Time start = absl::Now();
  ExpectRefused(
      worker->DeclareModel(ConstantSpec({{1 << 20}}, 1, 0.0f, 0.1f, 1 << 20)),
      absl::StatusCode::kResourceExhausted, "--max_shard_bytes",
      "a model over the shard's bytes");
  // 2e7 elements in 4-byte slices: five million slices, over the bound.
  ExpectRefused(
      worker->DeclareModel(ConstantSpec({{20000000}}, 1, 0.0f, 0.1f, 4)),
      absl::StatusCode::kInvalidArgument, "slices",
      "a model cut into absurdly many slices");
  // Refused before anything was built: well within one call's deadline.
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  const v1::ModelSpec small = ConstantSpec({{4}}, 1, 2.0f, 0.1f, 1024);
  ASSERT_TRUE(worker->DeclareModel(small).ok());
  EXPECT_EQ(Weights(**cluster, small)[0], std::vector<float>(4, 2.0f));
  // The refused models cost the shard nothing to speak of.
  std::ifstream status(
      absl::StrCat("/proc/", (*cluster)->process(0).pid(), "/status"));
  std::string line;
  int64_t peak_kb = 0;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) peak_kb = std::stoll(line.substr(6));
  }
  EXPECT_GT(peak_kb, 0);
  EXPECT_LT(peak_kb, 512 * 1024) << "the shard's peak memory, KiB";
}

}  // namespace
}  // namespace asyncps::testing
