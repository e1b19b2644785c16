// 16-bit wire dtypes: round to nearest even, the edges (ties, overflow,
// subnormals, NaN), and round trips within half a unit in the last place.
#include "common/wire_dtype.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace asyncps {
namespace {

float Bf16(float f) { return Bf16ToFloat(FloatToBf16(f)); }
float F16(float f) { return F16ToFloat(FloatToF16(f)); }

TEST(WireDtype, Bf16RoundsToNearestEven) {
  EXPECT_EQ(Bf16(1.0f), 1.0f);
  EXPECT_EQ(Bf16(-2.5f), -2.5f);
  const float ulp = std::ldexp(1.0f, -7);               // bf16 ulp at 1.
  EXPECT_EQ(Bf16(1.0f + ulp / 2), 1.0f);                // Tie to even (down).
  EXPECT_EQ(Bf16(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);  // Tie to even (up).
  EXPECT_EQ(Bf16(1.0f + ulp / 2 + ulp / 8), 1.0f + ulp);
  EXPECT_TRUE(std::isinf(Bf16(std::numeric_limits<float>::infinity())));
  EXPECT_TRUE(std::isnan(Bf16(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(std::isinf(Bf16(std::numeric_limits<float>::max())));
}

TEST(WireDtype, F16RoundsToNearestEvenWithItsRange) {
  EXPECT_EQ(F16(1.0f), 1.0f);
  EXPECT_EQ(F16(65504.0f), 65504.0f);  // Largest finite.
  EXPECT_EQ(F16(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isinf(F16(65520.0f)));  // Tie rounds to even: Inf.
  EXPECT_TRUE(std::isinf(F16(-1e6f)));
  EXPECT_LT(F16(-1e6f), 0);
  const float ulp = std::ldexp(1.0f, -10);
  EXPECT_EQ(F16(1.0f + ulp / 2), 1.0f);
  EXPECT_EQ(F16(1.0f + 3 * ulp / 2), 1.0f + 2 * ulp);
  const float tiny = std::ldexp(1.0f, -24);  // Smallest subnormal.
  EXPECT_EQ(F16(tiny), tiny);
  EXPECT_EQ(F16(3 * tiny), 3 * tiny);
  EXPECT_EQ(F16(tiny / 2), 0.0f);             // Tie to even: zero.
  EXPECT_EQ(F16(tiny / 2 + tiny / 8), tiny);  // Above the tie.
  EXPECT_EQ(F16(std::ldexp(1.0f, -14)), std::ldexp(1.0f, -14));
  EXPECT_TRUE(std::isnan(F16(std::numeric_limits<float>::quiet_NaN())));
}

TEST(WireDtype, RoundTripsStayWithinHalfAnUlp) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  std::uniform_int_distribution<int> exponent(-14, 14);
  std::vector<float> values(10000);
  for (float& v : values) {
    v = std::ldexp(mantissa(rng), exponent(rng)) * (rng() % 2 ? 1 : -1);
  }
  for (auto [dtype, bits] :
       {std::pair{v1::DTYPE_BF16, 8}, std::pair{v1::DTYPE_F16, 11}}) {
    std::string bytes;
    EncodeTensor(dtype, values, &bytes);
    ASSERT_EQ(bytes.size(), values.size() * 2);
    std::vector<float> back(values.size());
    DecodeTensor(dtype, bytes, absl::MakeSpan(back));
    for (size_t i = 0; i < values.size(); ++i) {
      const float half_ulp = std::ldexp(std::abs(values[i]), -bits);
      ASSERT_LE(std::abs(back[i] - values[i]), half_ulp)
          << v1::DType_Name(dtype) << " " << values[i];
    }
  }
  std::string bytes;
  EncodeTensor(v1::DTYPE_F32, values, &bytes);
  std::vector<float> back(values.size());
  DecodeTensor(v1::DTYPE_F32, bytes, absl::MakeSpan(back));
  EXPECT_EQ(back, values);
}

TEST(WireDtype, FirstNonFiniteFindsTheFirstNanOrInfAnywhere) {
  std::vector<float> values(10000, 1.0f);
  values[3] = std::numeric_limits<float>::max();
  values[5] = -std::numeric_limits<float>::denorm_min();
  EXPECT_EQ(FirstNonFinite(values), -1);
  EXPECT_EQ(FirstNonFinite({}), -1);
  // Within the first block, on a block boundary (4096), in the last one.
  for (size_t at : {size_t{0}, size_t{7}, size_t{4095}, size_t{4096},
                    size_t{9999}}) {
    for (float bad : {std::nanf(""), -std::nanf(""),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> v = values;
      v[at] = bad;
      if (at + 3 < v.size()) v[at + 3] = bad;  // Only the first counts.
      EXPECT_EQ(FirstNonFinite(v), static_cast<int64_t>(at)) << bad;
    }
  }
}

TEST(WireDtype, FlagNamesParse) {
  EXPECT_EQ(*ParseWireDtype("bf16"), v1::DTYPE_BF16);
  EXPECT_EQ(*ParseWireDtype("f16"), v1::DTYPE_F16);
  EXPECT_EQ(*ParseWireDtype("f32"), v1::DTYPE_F32);
  EXPECT_NE(ParseWireDtype("fp8").status().message().find("--wire_dtype=fp8"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace asyncps
