// --compress through the public client library (include/asyncps/client.h)
// and real ps_server processes: each codec, over each transport, changes
// exactly the weights the codec says, also when a large push is encoded on
// several threads, and a codec the servers refuse is named at connect.
#include <algorithm>
#include <string>
#include <tuple>
#include <vector>

#include "asyncps/client.h"
#include "common/compress.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "tests/integration/client_api.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

// --compress through real shards: three pushes of a tensor of `n` floats
// in slices of `slice` change exactly the weights the codec (with this
// worker's error feedback) says, computed here with a Compressor of the
// same slices.
void ExpectExactCompressedPushes(const TestCluster& cluster,
                                 const char* compress, const char* transport,
                                 int n, int slice) {
  ClientOptions o = Options(cluster, 0, 1);
  o.compress = compress;
  o.transport = transport;
  o.slice_bytes = 4 * slice;
  auto client = Client::Connect(o);
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<TensorSpec> model = {{"w", {n}}};
  ASSERT_TRUE((*client)
                  ->Declare(model, In({std::vector<float>(n, 0.0f)}), Sgd(1.0f))
                  .ok());
  Compressor local(*ParseCompression(compress));
  std::vector<float> want(n, 0.0f), sent(slice);
  for (int step = 0; step < 3; ++step) {
    std::vector<float> g(n);
    for (int i = 0; i < n; ++i) {
      g[i] =
          static_cast<float>((i * 7 + step * 3) % 11) - 5.0f + 0.25f * (i % 97);
    }
    ASSERT_TRUE((*client)->Push({"w"}, In({g})).ok());
    for (int s = 0; s < n / slice; ++s) {
      v1::SliceData d;
      local.Encode(s, absl::MakeConstSpan(g).subspan(slice * s, slice),
                   v1::DTYPE_F32, &d);
      if (d.dtype() == v1::DTYPE_BF16) {
        DecodeTensor(v1::DTYPE_BF16, d.data(), absl::MakeSpan(sent));
      } else {
        ASSERT_TRUE(
            DecodeCompressed(d.dtype(), d.data(), absl::MakeSpan(sent)).ok());
      }
      for (int k = 0; k < slice; ++k) want[slice * s + k] -= sent[k];
    }
  }
  std::vector<std::vector<float>> w = {std::vector<float>(n)};
  ASSERT_TRUE((*client)->Pull({"w"}, Out(&w)).ok());
  const auto [got, wanted] =
      std::mismatch(w[0].begin(), w[0].end(), want.begin());
  EXPECT_TRUE(got == w[0].end())
      << compress << " over " << transport << ": element "
      << (got - w[0].begin()) << " is " << *got << ", want " << *wanted;
}

class CompressedPush
    : public ::testing::TestWithParam<std::tuple<const char*, const char*>> {};

TEST_P(CompressedPush, ChangesExactlyTheWeightsTheCodecSays) {
  const auto [compress, transport] = GetParam();
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // Six slices of four.
  ExpectExactCompressedPushes(**cluster, compress, transport, 24, 4);
  ClientOptions bad = Options(**cluster, 0, 1);
  bad.compress = "topk:2";
  auto refused = Client::Connect(bad);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("topk:2"), std::string::npos);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, CompressedPush,
    ::testing::Combine(::testing::Values("bf16", "topk:0.25", "onebit"),
                       ::testing::Values("tcp", "grpc")));

// A push past 4 M elements a shard is encoded on several threads
// (PsClient::FillPush): the same exact weights.
TEST(CompressedPushLarge, EncodedOnThreadsChangesExactlyTheSameWeights) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  // 144 slices of 64 Ki floats, 4.7 M floats a shard.
  ExpectExactCompressedPushes(**cluster, "topk:0.01", "tcp", 9 << 20, 1 << 16);
}

}  // namespace
}  // namespace asyncps::testing
