#include "common/wire_dtype.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/tensor_bytes.h"

namespace asyncps {
namespace {

// Bit casts the vectorizer sees through (a memcpy per element it does not).
uint32_t Bits(float f) { return __builtin_bit_cast(uint32_t, f); }
float FromBits(uint32_t u) { return __builtin_bit_cast(float, u); }

// Branch-free, so the loops over it vectorize.
inline uint16_t ToBf16(float f) {
  const uint32_t u = Bits(f);
  // Round to nearest, ties to even; overflow rounds to Inf as it should.
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (u >> 16) | 0x0040u;
  const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(nan ? quiet_nan : rounded);
}

inline float FromBf16(uint16_t h) { return FromBits(uint32_t{h} << 16); }

inline uint16_t ToF16(float f) {
  const uint32_t u = Bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;        // NaN.
  if (a >= 0x477ff000u) return sign | 0x7c00u;       // >= 65520: Inf.
  if (a < 0x38800000u) {                             // Below 2^-14: subnormal.
    if (a < 0x33000000u) return sign;                // Below 2^-25: zero.
    const uint32_t e = a >> 23;                      // 102 .. 112.
    const uint32_t m = (a & 0x7fffffu) | 0x800000u;  // With the hidden bit.
    const uint32_t shift = 126 - e;                  // 14 .. 24.
    uint32_t h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u))) ++h;
    return sign | static_cast<uint16_t>(h);
  }
  // Normal: rebias the exponent (127 -> 15), round the mantissa 23 -> 10.
  uint32_t h = ((a - 0x38000000u) >> 13);
  const uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // May carry: ok.
  return sign | static_cast<uint16_t>(h);
}

inline float FromF16(uint16_t h) {
  const uint32_t sign = uint32_t{h & 0x8000u} << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0x1f) return FromBits(sign | 0x7f800000u | (m << 13));  // Inf/NaN.
  if (e != 0) return FromBits(sign | ((e + 112) << 23) | (m << 13));
  // Subnormal (or zero): m * 2^-24.
  const float v = static_cast<float>(m) * 5.9604644775390625e-8f;
  return sign != 0 ? -v : v;
}

// Converts in chunks through a local uint16_t buffer, so the conversion
// loop has no memcpy per element and the compiler vectorizes it (-O3).
constexpr size_t kChunk = 2048;

template <uint16_t (*Encode)(float)>
void EncodeHalves(absl::Span<const float> values, std::string* out) {
  out->resize(values.size() * 2);
  char* p = out->data();
  uint16_t buf[kChunk];
  for (size_t i = 0; i < values.size(); i += kChunk) {
    const size_t n = std::min(kChunk, values.size() - i);
    const float* __restrict in = values.data() + i;
    for (size_t k = 0; k < n; ++k) buf[k] = Encode(in[k]);
    std::memcpy(p + 2 * i, buf, 2 * n);  // Little-endian host.
  }
}

template <float (*Decode)(uint16_t)>
void DecodeHalves(absl::string_view bytes, absl::Span<float> out) {
  uint16_t buf[kChunk];
  for (size_t i = 0; i < out.size(); i += kChunk) {
    const size_t n = std::min(kChunk, out.size() - i);
    std::memcpy(buf, bytes.data() + 2 * i, 2 * n);
    float* __restrict dst = out.data() + i;
    for (size_t k = 0; k < n; ++k) dst[k] = Decode(buf[k]);
  }
}

}  // namespace

uint16_t FloatToBf16(float f) { return ToBf16(f); }
float Bf16ToFloat(uint16_t h) { return FromBf16(h); }
uint16_t FloatToF16(float f) { return ToF16(f); }
float F16ToFloat(uint16_t h) { return FromF16(h); }

void EncodeTensor(v1::DType dtype, absl::Span<const float> values,
                  std::string* out) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      EncodeHalves<ToBf16>(values, out);
      return;
    case v1::DTYPE_F16:
      EncodeHalves<ToF16>(values, out);
      return;
    default:
      EncodeF32(values, out);
  }
}

namespace {

// Elements looked at together: a fixed count, so that the compiler
// vectorizes the loop at -O2 (its cheap cost model takes no loop of
// unknown length).
constexpr size_t kFiniteLanes = 64;

// True if any of p[0, kFiniteLanes) is Inf or NaN (exponent all ones),
// branch-free.
bool AnyNonFinite(const float* __restrict p) {
  constexpr uint32_t kExponent = 0x7f800000;
  uint32_t any = 0;
  for (size_t i = 0; i < kFiniteLanes; ++i) {
    any |= (Bits(p[i]) & kExponent) == kExponent;
  }
  return any != 0;
}

}  // namespace

int64_t FirstNonFinite(absl::Span<const float> values) {
  size_t i = 0;
  while (i + kFiniteLanes <= values.size() && !AnyNonFinite(&values[i])) {
    i += kFiniteLanes;
  }
  for (; i < values.size(); ++i) {
    if (!std::isfinite(values[i])) return static_cast<int64_t>(i);
  }
  return -1;
}

void DecodeTensor(v1::DType dtype, absl::string_view bytes,
                  absl::Span<float> out) {
  switch (dtype) {
    case v1::DTYPE_BF16:
      DecodeHalves<FromBf16>(bytes, out);
      return;
    case v1::DTYPE_F16:
      DecodeHalves<FromF16>(bytes, out);
      return;
    default:
      DecodeF32(bytes, out);
  }
}

absl::StatusOr<v1::DType> ParseWireDtype(absl::string_view text) {
  if (text == "f32") return v1::DTYPE_F32;
  if (text == "bf16") return v1::DTYPE_BF16;
  if (text == "f16") return v1::DTYPE_F16;
  return absl::InvalidArgumentError(
      absl::StrCat("--wire_dtype=", text, " (want f32, bf16 or f16)"));
}

std::string WireDtypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return "f32";
    case v1::DTYPE_BF16:
      return "bf16";
    case v1::DTYPE_F16:
      return "f16";
    default:
      return "";
  }
}

}  // namespace asyncps
