// A shard holding embedding rows is checkpointed, SIGKILLed and restarted
// (real processes): its rows come back with their optimizer state, and
// training goes on exactly as a local table's that never stopped, in async
// and in bsp (where the restored table's step is learnt from the next
// push).
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/admin_client.h"
#include "client/embedding_client.h"
#include "client/ps_client.h"
#include "common/mode.h"
#include "gtest/gtest.h"
#include "server/embedding_table.h"
#include "tests/integration/test_cluster.h"
#include "tests/testing/temp_dir.h"

namespace asyncps::testing {
namespace {

class EmbeddingRecovery : public ::testing::TestWithParam<const char*> {};

TEST_P(EmbeddingRecovery, RowsComeBackAfterASigkilledShardRestarts) {
  const std::string dir = FreshTempDir("embedding_checkpoints");
  const std::vector<std::string> flags = {"--checkpoint_dir=" + dir,
                                          "--checkpoint_every=1h",
                                          absl::StrCat("--mode=", GetParam())};
  auto cluster = TestCluster::Start(2, flags);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  PsClientOptions options;
  options.servers = (*cluster)->servers();
  options.retry_for = absl::Seconds(30);
  options.backoff_initial = absl::Milliseconds(20);
  auto worker = PsClient::Create(options);
  ASSERT_TRUE(worker.ok());
  ASSERT_TRUE((*worker)->Join(0, 1).ok());
  // Checkpoints are of a model: a dense part beside the table.
  ASSERT_TRUE(
      (*worker)->DeclareModel(ConstantSpec({{4}}, 2, 0, 0.1f, 16)).ok());
  // The worker's clock, as Client keeps it: a step's push carries
  // clock + 1, a pull the clock.
  int64_t clock = 0;
  EmbeddingClient rows((*worker)->caller(),
                       {*ParseMode(GetParam()), [&clock] { return clock; }});
  v1::EmbeddingSpec spec;
  spec.set_name("users");
  spec.set_dim(8);
  spec.mutable_init()->set_kind(v1::Initializer::NORMAL);
  spec.mutable_init()->set_stddev(0.1f);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAGRAD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_optimizer()->set_epsilon(1e-6f);
  ASSERT_TRUE(rows.Declare(spec).ok());
  EmbeddingTable reference(spec);

  std::mt19937_64 random(9);
  std::vector<int64_t> ids(200);
  for (int64_t& id : ids) id = static_cast<int64_t>(random() >> 1);
  auto train = [&](int round) {
    std::vector<float> g(ids.size() * 8);
    for (size_t k = 0; k < g.size(); ++k) g[k] = 0.01f * (k % 17) - round;
    ASSERT_TRUE(rows.PushRows("users", ids, g).ok());
    ASSERT_TRUE(reference.Push(ids, g).ok());
    ASSERT_TRUE(rows.EndStep().ok());  // As Client::EndStep, in bsp.
    ++clock;
  };
  auto expect_reference = [&](const char* when) {
    std::vector<float> got(ids.size() * 8), want(ids.size() * 8);
    absl::Status s = rows.PullRows("users", ids, absl::MakeSpan(got));
    ASSERT_TRUE(s.ok()) << s;
    ASSERT_TRUE(reference.Pull(ids, absl::MakeSpan(want)).ok());
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_NEAR(got[k], want[k], 1e-6) << when << ", element " << k;
    }
  };
  for (int round = 0; round < 3; ++round) train(round);
  AdminClient admin((*worker)->caller());
  for (int shard = 0; shard < 2; ++shard) {
    ASSERT_TRUE(admin.Checkpoint(shard).ok());
  }

  ASSERT_TRUE((*cluster)->Restart(1, flags).ok());
  ASSERT_TRUE((*worker)->Join(0, 1).ok());  // Registered again there.
  expect_reference("after the restart");
  for (int round = 3; round < 5; ++round) train(round);
  expect_reference("after two more rounds");  // AdaGrad's sums came back.
}

INSTANTIATE_TEST_SUITE_P(Modes, EmbeddingRecovery,
                         ::testing::Values("async", "bsp"));

}  // namespace
}  // namespace asyncps::testing
