// The second half of declaring a model with its initial weights
// (PsClient::SendInitialWeights) when the shard restarts in between, as
// chaos does in a job's first second: the weights go again to a shard that
// lost the declaration, and a shard that already took a copy keeps it.
#include <memory>
#include <vector>

#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

class DeclareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto shards = StartLocalShards(1);
    ASSERT_TRUE(shards.ok()) << shards.status();
    shards_ = *std::move(shards);
    PsClientOptions options;
    options.servers = shards_.addresses;
    auto client = PsClient::Create(options);
    ASSERT_TRUE(client.ok()) << client.status();
    client_ = *std::move(client);
    ASSERT_TRUE(client_->Join(0, 1).ok());
    ASSERT_TRUE(client_->DeclareModel(spec_, Views(initial_)).ok());
  }

  void RestartShard() {
    ASSERT_TRUE(RestartLocalShard(&shards_, 0).ok());
    // A worker's heartbeat registers it again.
    ASSERT_TRUE(client_->Join(0, 1).ok());
  }

  std::vector<std::vector<float>> Pulled() {
    std::vector<std::vector<float>> w = {std::vector<float>(20),
                                         std::vector<float>(5)};
    std::vector<SliceVersion> versions;
    EXPECT_TRUE(client_->Pull({0, 1}, &w, &versions, -1, 0).ok());
    return w;
  }

  static ConstTensorViews Views(const std::vector<std::vector<float>>& w) {
    return ConstTensorViews(w.begin(), w.end());
  }

  const v1::ModelSpec spec_ = ConstantSpec({{4, 5}, {5}}, 1, 1.0f, 0.5f, 64);
  const std::vector<std::vector<float>> initial_ = {
      std::vector<float>(20, 0.25f), std::vector<float>(5, -2.0f)};
  LocalShards shards_;
  std::unique_ptr<PsClient> client_;
};

TEST_F(DeclareTest, WeightsGoAgainToAShardThatRestartedBeforeThem) {
  RestartShard();
  // The shard has no model: a plain Restore is refused, naming that.
  const std::vector<SliceVersion> zero(client_->partition().slices().size());
  absl::Status refused = client_->Restore(0, Views(initial_), zero, 0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  ASSERT_TRUE(client_->SendInitialWeights(0, Views(initial_)).ok());
  EXPECT_EQ(Pulled(), initial_);
}

TEST_F(DeclareTest, AShardThatTookACopyAlreadyKeepsIt) {
  const std::vector<std::vector<float>> other = {std::vector<float>(20, 9.0f),
                                                 std::vector<float>(5, 9.0f)};
  ASSERT_TRUE(client_->SendInitialWeights(0, Views(other)).ok());
  EXPECT_EQ(Pulled(), initial_);
}

}  // namespace
}  // namespace asyncps::testing
