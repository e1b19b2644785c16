// A real shard with --checkpoint_dir: trained weights survive a restart, and
// a damaged newest checkpoint falls back to the one before.
#include <signal.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

std::unique_ptr<PsClient> Client(int port) {
  PsClientOptions options;
  options.servers = {ServerAddress{"127.0.0.1", port}};
  auto client = PsClient::Create(options);
  EXPECT_TRUE(client.ok());
  EXPECT_TRUE((*client)->Join(0, 1).ok());  // Rank 0 of a one-worker job.
  return *std::move(client);
}

TEST(Checkpoint, TrainedWeightsSurviveARestart) {
  const std::string dir = FreshTempDir("ckpt");
  const std::vector<std::string> flags = {"--checkpoint_dir=" + dir,
                                          "--checkpoint_every=0"};
  v1::ModelSpec spec = ConstantSpec({{50, 40}, {40}}, 1, 1.0f, 0.5f, 1024);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::MOMENTUM);
  spec.mutable_optimizer()->set_momentum(0.5f);
  const std::vector<int> tensors = {0, 1};
  std::vector<std::vector<float>> before(2), after(2), grads(2);
  std::vector<SliceVersion> v_before, v_after;
  for (int t = 0; t < 2; ++t) {
    before[t].resize(t == 0 ? 2000 : 40);
    after[t].resize(before[t].size());
    grads[t].assign(before[t].size(), 0.25f);
  }
  std::string first_path;
  {
    int port = 0;
    auto server = StartServer(0, 1, &port, flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = Client(port);
    ASSERT_TRUE(client->DeclareModel(spec).ok());
    std::vector<SliceVersion> versions;
    ASSERT_TRUE(client->Pull(tensors, &before, &versions, -1, 0).ok());
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE(client->Push(tensors, grads, versions, 0, 0, nullptr).ok());
    }
    auto path = AdminClient(client->caller()).Checkpoint(0);  // On request...
    ASSERT_TRUE(path.ok()) << path.status();
    first_path = *path;
    ASSERT_TRUE(client->Push(tensors, grads, versions, 0, 0, nullptr).ok());
    ASSERT_TRUE(client->Pull(tensors, &before, &v_before, -1, 0).ok());
    (*server)->Signal(SIGTERM);  // ... and at exit.
    ASSERT_EQ(ExitCode(**server, absl::Seconds(30)), 0);
  }
  {
    int port = 0;
    auto server = StartServer(0, 1, &port, flags);
    ASSERT_TRUE(server.ok()) << server.status();
    auto client = Client(port);
    ASSERT_TRUE(client->FetchModel().ok());  // Restored, not redeclared.
    ASSERT_TRUE(client->Pull(tensors, &after, &v_after, -1, 0).ok());
    EXPECT_EQ(after, before);
    ASSERT_EQ(v_after.size(), v_before.size());
    for (size_t i = 0; i < v_after.size(); ++i) {
      EXPECT_EQ(v_after[i].version, v_before[i].version);
      // A new start of the shard: versions from before are not its own.
      EXPECT_NE(v_after[i].incarnation, v_before[i].incarnation);
    }
    for (const SliceVersion& v : v_after) EXPECT_EQ(v.version, 4);
    (*server)->Signal(SIGTERM);
    ASSERT_EQ(ExitCode(**server, absl::Seconds(30)), 0);
  }
  // Damage every checkpoint but the one taken on request: the restart falls
  // back to it (3 pushes).
  int damaged = 0;
  for (const std::string& file : ListFiles(dir, "shard-0-", ".ckpt")) {
    if (file == first_path) continue;
    std::ofstream(file, std::ios::trunc) << "ASYNCPSC\x01";
    ++damaged;
  }
  EXPECT_GE(damaged, 1);
  int port = 0;
  auto server = StartServer(0, 1, &port, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  auto client = Client(port);
  ASSERT_TRUE(client->FetchModel().ok());
  ASSERT_TRUE(client->Pull(tensors, &after, &v_after, -1, 0).ok());
  for (const SliceVersion& v : v_after) EXPECT_EQ(v.version, 3);
}

}  // namespace
}  // namespace asyncps::testing
