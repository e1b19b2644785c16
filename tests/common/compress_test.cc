// The gradient codecs (common/compress.h): --compress parsing; top-k picks
// the largest magnitudes, ties to the lower index, and round-trips them
// exactly; one-bit keeps signs and the mean magnitude; bf16 of
// representable values is exact; error feedback keeps exactly what was
// left out (applied + residual = the sum of the gradients); and every
// malformed payload is refused with a message naming the fault.
#include "common/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/wire_dtype.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

std::vector<float> Decoded(const v1::SliceData& d, size_t n) {
  std::vector<float> out(n);
  absl::Status s = DecodeCompressed(d.dtype(), d.data(), absl::MakeSpan(out));
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

TEST(CompressTest, ParsesEachKindAndRefusesOthersByName) {
  EXPECT_EQ(ParseCompression("none")->kind, Compression::kNone);
  EXPECT_EQ(ParseCompression("bf16")->kind, Compression::kBf16);
  EXPECT_EQ(ParseCompression("f16")->kind, Compression::kF16);
  EXPECT_EQ(ParseCompression("onebit")->kind, Compression::kOneBit);
  auto topk = ParseCompression("topk:0.01");
  ASSERT_TRUE(topk.ok());
  EXPECT_EQ(topk->kind, Compression::kTopK);
  EXPECT_DOUBLE_EQ(topk->ratio, 0.01);
  EXPECT_EQ(topk->Name(), "topk:0.01");
  for (const char* bad : {"topk:0", "topk:1.5", "topk:x", "topk:", "gzip",
                          "topk:-0.1", "topk:nan"}) {
    auto c = ParseCompression(bad);
    ASSERT_FALSE(c.ok()) << bad;
    EXPECT_NE(c.status().message().find(bad), std::string::npos) << c.status();
  }
  EXPECT_EQ(TopKCount(1000, 0.01), 10u);
  EXPECT_EQ(TopKCount(10, 0.01), 1u);  // At least one element.
  EXPECT_EQ(TopKCount(10, 1.0), 10u);
}

TEST(CompressTest, TopKSendsTheLargestMagnitudesTiesToTheLowerIndex) {
  const std::vector<float> g = {0.5f, -3.0f, 2.0f, -2.0f, 0.0f, 3.0f, 1.0f};
  std::string bytes;
  std::vector<float> sent(g.size());
  EncodeTopK(g, 3.0 / 7.0, &bytes, absl::MakeSpan(sent));
  // |-3| and |3| first; of the tied 2 and -2, index 2.
  EXPECT_EQ(sent, (std::vector<float>{0, -3, 2, 0, 0, 3, 0}));
  ASSERT_EQ(bytes.size(), 4u + 3 * 8);
  std::vector<float> out(g.size(), 7.0f);
  ASSERT_TRUE(
      DecodeCompressed(v1::DTYPE_TOPK, bytes, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, sent);  // Exact: the values travel as f32.
}

// Large slices take the sampled threshold: the same k elements as a full
// sort by (magnitude descending, index ascending), many ties included.
TEST(CompressTest, TopKOfLargeSlicesMatchesAFullSort) {
  std::mt19937 random(11);
  for (const size_t n : {1024u, 5000u, 65536u}) {
    for (const double ratio : {0.001, 0.01, 0.1}) {
      std::vector<float> g(n);
      std::uniform_int_distribution<int> small(-20, 20);
      for (float& x : g) x = 0.5f * static_cast<float>(small(random));
      std::vector<uint32_t> order(n);
      for (uint32_t i = 0; i < n; ++i) order[i] = i;
      std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
        const float x = std::fabs(g[a]), y = std::fabs(g[b]);
        return x > y || (x == y && a < b);
      });
      std::vector<float> want(n, 0.0f);
      for (size_t j = 0; j < TopKCount(n, ratio); ++j) {
        want[order[j]] = g[order[j]];
      }
      std::string bytes;
      std::vector<float> sent(n);
      EncodeTopK(g, ratio, &bytes, absl::MakeSpan(sent));
      EXPECT_EQ(sent, want) << n << " " << ratio;
    }
  }
}

TEST(CompressTest, OneBitKeepsSignsAndTheMeanMagnitude) {
  const std::vector<float> g = {1.0f,  -2.0f, 3.0f, -6.0f, 0.0f,
                                -0.0f, 4.0f,  1.0f, -1.0f};
  std::string bytes;
  std::vector<float> sent(g.size());
  EncodeOneBit(g, &bytes, absl::MakeSpan(sent));
  ASSERT_EQ(bytes.size(), 4u + 2);  // 9 elements: two bytes of signs.
  float scale;
  std::memcpy(&scale, bytes.data(), 4);
  EXPECT_FLOAT_EQ(scale, 18.0f / 9.0f);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_EQ(sent[i], std::signbit(g[i]) ? -scale : scale) << i;
  }
  std::vector<float> out(g.size());
  ASSERT_TRUE(
      DecodeCompressed(v1::DTYPE_ONEBIT, bytes, absl::MakeSpan(out)).ok());
  EXPECT_EQ(out, sent);
}

// For each codec, over many pushes of random gradients: what the servers
// decode, summed, plus the residual left on the worker equals the sum of
// the gradients (to float rounding of the sums).
TEST(CompressTest, ErrorFeedbackCarriesExactlyTheResidual) {
  for (const char* kind : {"bf16", "f16", "topk:0.05", "onebit"}) {
    Compressor c(*ParseCompression(kind));
    std::mt19937 random(7);
    std::normal_distribution<float> normal;
    const size_t n = 300;
    std::vector<double> pushed(n, 0), applied(n, 0);
    for (int step = 0; step < 50; ++step) {
      std::vector<float> g(n);
      for (float& x : g) x = normal(random);
      v1::SliceData d;
      c.Encode(3, g, v1::DTYPE_F32, &d);
      std::vector<float> out(n);
      if (d.dtype() == v1::DTYPE_BF16 || d.dtype() == v1::DTYPE_F16) {
        DecodeTensor(d.dtype(), d.data(), absl::MakeSpan(out));
      } else {
        out = Decoded(d, n);
      }
      for (size_t i = 0; i < n; ++i) {
        pushed[i] += g[i];
        applied[i] += out[i];
      }
    }
    const std::vector<float> r = c.Residual(3);
    ASSERT_EQ(r.size(), n) << kind;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(applied[i] + r[i], pushed[i], 1e-3) << kind << " " << i;
    }
    EXPECT_TRUE(c.Residual(4).empty());  // Per slice.
  }
  // none: the fallback dtype, no residual kept.
  Compressor none(Compression{});
  v1::SliceData d;
  none.Encode(0, std::vector<float>{1.5f, -2.0f}, v1::DTYPE_BF16, &d);
  EXPECT_EQ(d.dtype(), v1::DTYPE_BF16);
  EXPECT_EQ(d.data().size(), 4u);
  EXPECT_TRUE(none.Residual(0).empty());
}

// A gradient pushed again (bsp, after a shard's restart broke the push
// off) goes as it went, and error feedback counts it once.
TEST(CompressTest, APushSentAgainIsTheSamePayloadAndKeepsTheResidual) {
  for (const char* kind : {"bf16", "f16", "topk:0.05", "onebit"}) {
    Compressor c(*ParseCompression(kind));
    std::mt19937 random(11);
    std::normal_distribution<float> normal;
    std::vector<float> g(300);
    for (int step = 0; step < 3; ++step) {
      for (float& x : g) x = normal(random);
      v1::SliceData first, again;
      c.Encode(2, g, v1::DTYPE_F32, &first);
      const std::vector<float> residual = c.Residual(2);
      c.Encode(2, g, v1::DTYPE_F32, &again, /*again=*/true);
      EXPECT_EQ(again.dtype(), first.dtype()) << kind;
      EXPECT_EQ(again.data(), first.data()) << kind << " step " << step;
      EXPECT_EQ(c.Residual(2), residual) << kind << " step " << step;
    }
    // A plain second push of the same gradient is a new gradient.
    v1::SliceData d;
    const std::vector<float> before = c.Residual(2);
    c.Encode(2, g, v1::DTYPE_F32, &d);
    EXPECT_NE(c.Residual(2), before) << kind;
  }
}

TEST(CompressTest, Bf16OfRepresentableValuesIsExactAndLeavesNoResidual) {
  Compressor c(*ParseCompression("bf16"));
  const std::vector<float> g = {1.0f, -0.5f, 3.0f, 0.0f, 1024.0f};
  v1::SliceData d;
  c.Encode(0, g, v1::DTYPE_F32, &d);
  std::vector<float> out(g.size());
  DecodeTensor(v1::DTYPE_BF16, d.data(), absl::MakeSpan(out));
  EXPECT_EQ(out, g);
  EXPECT_EQ(c.Residual(0), std::vector<float>(g.size(), 0.0f));
}

std::string TopKBytes(uint32_t k, const std::vector<uint32_t>& indices,
                      const std::vector<float>& values) {
  std::string b(reinterpret_cast<const char*>(&k), 4);
  for (uint32_t i : indices) b.append(reinterpret_cast<const char*>(&i), 4);
  for (float v : values) b.append(reinterpret_cast<const char*>(&v), 4);
  return b;
}

TEST(CompressTest, MalformedPayloadsAreRefusedNamingTheFault) {
  std::vector<float> out(8);
  auto refused = [&](v1::DType dtype, const std::string& bytes,
                     const std::string& says) {
    absl::Status s = DecodeCompressed(dtype, bytes, absl::MakeSpan(out));
    EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
    EXPECT_NE(s.message().find(says), std::string::npos) << s;
  };
  refused(v1::DTYPE_TOPK, TopKBytes(2, {1, 8}, {1, 1}), "outside");
  refused(v1::DTYPE_TOPK, TopKBytes(2, {3, 3}, {1, 1}), "ascend");
  refused(v1::DTYPE_TOPK, TopKBytes(2, {4, 3}, {1, 1}), "ascend");
  refused(v1::DTYPE_TOPK, TopKBytes(3, {1, 2}, {1, 1}), "says 3");
  refused(v1::DTYPE_TOPK, TopKBytes(9, {}, {}), "says 9");
  refused(v1::DTYPE_TOPK, TopKBytes(1, {1}, {NAN}), "value");
  refused(v1::DTYPE_TOPK, "ab", "no count");
  std::string onebit(4 + 1, '\0');
  refused(v1::DTYPE_ONEBIT, onebit + "x", "need 5");
  const float bad = -1.0f;
  std::memcpy(onebit.data(), &bad, 4);
  refused(v1::DTYPE_ONEBIT, onebit, "scale");
  refused(v1::DTYPE_F32, std::string(32, '\0'), "not compressed");
  ASSERT_TRUE(DecodeCompressed(v1::DTYPE_TOPK, TopKBytes(0, {}, {}),
                               absl::MakeSpan(out))
                  .ok());
  EXPECT_EQ(out, std::vector<float>(8, 0.0f));
}

}  // namespace
}  // namespace asyncps
