// PsClient's fused PushPull against two in-process shards over loopback
// TCP: it leaves the servers with exactly the weights a Push and a Pull
// leave, and answers them; 16-bit wire dtypes give the same weights within
// their rounding.
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

class PushPullTest : public ::testing::Test {
 protected:
  // Two fresh shards, and a client with `dtype` on the wire.
  std::unique_ptr<PsClient> Cluster(v1::DType dtype) {
    auto shards = StartLocalShards(2);
    EXPECT_TRUE(shards.ok()) << shards.status();
    if (!shards.ok()) return nullptr;
    shards_ = *std::move(shards);
    PsClientOptions options;
    options.wire_dtype = dtype;
    options.servers = shards_.addresses;
    auto client = PsClient::Create(options);
    EXPECT_TRUE(client.ok());
    EXPECT_TRUE((*client)->Join(0, 1).ok());
    EXPECT_TRUE((*client)->DeclareModel(spec_).ok());
    return *std::move(client);
  }

  // Three rounds of gradients; returns the weights the last answer held.
  std::vector<std::vector<float>> Train(PsClient* client, bool fused) {
    std::vector<std::vector<float>> w = {std::vector<float>(3000),
                                         std::vector<float>(50)};
    std::vector<SliceVersion> versions;
    EXPECT_TRUE(client->Pull(tensors_, &w, &versions, 0, 0).ok());
    for (int round = 1; round <= 3; ++round) {
      std::vector<std::vector<float>> g = w;
      for (auto& t : g) {
        for (size_t i = 0; i < t.size(); ++i) t[i] = 0.01f * (i % 7) - round;
      }
      PushStats r;
      if (fused) {
        EXPECT_TRUE(
            client->PushPull(tensors_, g, versions, 0, round, &w, &versions, &r)
                .ok());
      } else {
        EXPECT_TRUE(client->Push(tensors_, g, versions, 0, round, &r).ok());
        EXPECT_TRUE(client->Pull(tensors_, &w, &versions, 0, round).ok());
      }
      EXPECT_EQ(r.slices, static_cast<int64_t>(versions.size()));
      for (const SliceVersion& v : versions) EXPECT_EQ(v.version, round);
    }
    return w;
  }

  const std::vector<int> tensors_ = {0, 1};
  const v1::ModelSpec spec_ =
      ConstantSpec({{60, 50}, {50}}, 2, 1.0f, 0.5f, 1024);
  LocalShards shards_;
};

TEST_F(PushPullTest, FusedCallGivesExactlyTheWeightsOfPushThenPull) {
  auto separate = Train(Cluster(v1::DTYPE_F32).get(), /*fused=*/false);
  auto fused = Train(Cluster(v1::DTYPE_F32).get(), /*fused=*/true);
  EXPECT_EQ(fused, separate);
  EXPECT_NE(separate[0][1], 1.0f);  // Training moved them.
}

TEST_F(PushPullTest, SixteenBitWireGivesTheWeightsWithinItsRounding) {
  auto exact = Train(Cluster(v1::DTYPE_F32).get(), /*fused=*/true);
  for (auto [dtype, bits] :
       {std::pair{v1::DTYPE_BF16, 8}, std::pair{v1::DTYPE_F16, 11}}) {
    auto got = Train(Cluster(dtype).get(), /*fused=*/true);
    for (int t = 0; t < 2; ++t) {
      for (size_t i = 0; i < exact[t].size(); ++i) {
        // Three gradients (each rounded) moved the weight, then the weight
        // itself was rounded: a few half-ulps of the largest magnitude.
        const float tolerance = std::ldexp(4.0f, -bits) * 4;
        ASSERT_NEAR(got[t][i], exact[t][i], tolerance)
            << v1::DType_Name(dtype) << " tensor " << t << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace asyncps::testing
