#include "common/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/wire_dtype.h"

namespace asyncps {
namespace {

template <typename T>
void Append(std::string* out, T value) {
  out->append(reinterpret_cast<const char*>(&value), sizeof(T));
}

template <typename T>
T Read(absl::string_view bytes, size_t at) {
  T value;
  std::memcpy(&value, bytes.data() + at, sizeof(T));
  return value;
}

}  // namespace

std::string Compression::Name() const {
  switch (kind) {
    case kBf16:
      return "bf16";
    case kF16:
      return "f16";
    case kTopK:
      return absl::StrCat("topk:", ratio);
    case kOneBit:
      return "onebit";
    default:
      return "none";
  }
}

absl::StatusOr<Compression> ParseCompression(absl::string_view text) {
  Compression c;
  if (text == "none" || text.empty()) return c;
  if (text == "bf16") {
    c.kind = Compression::kBf16;
    return c;
  }
  if (text == "f16") {
    c.kind = Compression::kF16;
    return c;
  }
  if (text == "onebit") {
    c.kind = Compression::kOneBit;
    return c;
  }
  absl::string_view ratio = text;
  if (absl::ConsumePrefix(&ratio, "topk:")) {
    if (!absl::SimpleAtod(ratio, &c.ratio) || !(c.ratio > 0) || c.ratio > 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--compress=", text, ": the top-k ratio must be a number in (0, 1]"));
    }
    c.kind = Compression::kTopK;
    return c;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "--compress=", text, " (want none, bf16, f16, topk:RATIO or onebit)"));
}

size_t TopKCount(size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, n);
}

namespace {

// The k (1 <= k <= x.size()) largest-magnitude elements of `x`, ties to
// the lower index, in ascending order. A strided sample first gives a
// threshold most likely a little below the k-th largest magnitude, so only
// the elements above it (about 2k) are looked at again; if the sample
// misled, all are.
std::vector<uint32_t> TopKIndices(absl::Span<const float> x, size_t k) {
  const size_t n = x.size();
  std::vector<uint32_t> candidates;  // Ascending.
  constexpr size_t kStride = 16;
  if (n >= 64 * kStride && k * 64 <= n) {
    std::vector<float> sample;
    sample.reserve(n / kStride + 1);
    for (size_t i = 0; i < n; i += kStride) sample.push_back(std::fabs(x[i]));
    // The sample's (2k / stride + 8)-th largest: about 2k + 128 elements
    // of x lie at or above it.
    const size_t r = std::min(sample.size(), 2 * k / kStride + 8);
    std::nth_element(sample.begin(), sample.begin() + (r - 1), sample.end(),
                     std::greater<float>());
    const float low = sample[r - 1];
    candidates.reserve(2 * k + 256);
    for (size_t i = 0; i < n; ++i) {
      if (std::fabs(x[i]) >= low)
        candidates.push_back(static_cast<uint32_t>(i));
    }
  }
  if (candidates.size() < k) {  // No sample taken, or it aimed too high.
    candidates.resize(n);
    for (size_t i = 0; i < n; ++i) candidates[i] = static_cast<uint32_t>(i);
  }
  // Every element with a magnitude of at least the k-th largest is a
  // candidate: that magnitude, found among them, is the slice's.
  std::vector<float> magnitudes(candidates.size());
  for (size_t j = 0; j < candidates.size(); ++j) {
    magnitudes[j] = std::fabs(x[candidates[j]]);
  }
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1),
                   magnitudes.end(), std::greater<float>());
  const float t = magnitudes[k - 1];
  // Those above it, then as many of those equal to it as fit, lowest
  // indices first.
  std::vector<uint32_t> chosen, equal;
  chosen.reserve(k);
  for (uint32_t i : candidates) {
    const float a = std::fabs(x[i]);
    if (a > t) {
      chosen.push_back(i);
    } else if (a == t) {
      equal.push_back(i);
    }
  }
  equal.resize(std::min(equal.size(), k - chosen.size()));
  const size_t above = chosen.size();
  chosen.insert(chosen.end(), equal.begin(), equal.end());
  std::inplace_merge(chosen.begin(), chosen.begin() + above, chosen.end());
  return chosen;
}

// Top-k of `x` into `out`; `x` is left with what was not sent (the sent
// elements zeroed), and `sent` (if not empty) gets what was.
void TopKInPlace(absl::Span<float> x, double ratio, std::string* out,
                 absl::Span<float> sent) {
  const size_t k = TopKCount(x.size(), ratio);
  const std::vector<uint32_t> chosen =
      k > 0 ? TopKIndices(x, k) : std::vector<uint32_t>();
  out->clear();
  out->reserve(sizeof(uint32_t) + k * (sizeof(uint32_t) + sizeof(float)));
  Append(out, static_cast<uint32_t>(chosen.size()));
  for (uint32_t i : chosen) Append(out, i);
  for (uint32_t i : chosen) Append(out, x[i]);
  if (!sent.empty()) std::fill(sent.begin(), sent.end(), 0.0f);
  for (uint32_t i : chosen) {
    if (!sent.empty()) sent[i] = x[i];
    x[i] = 0.0f;
  }
}

// One-bit of `x` into `out`; `x` is left with x - the decoded value, and
// `sent` (if not empty) gets the decoded value.
void OneBitInPlace(absl::Span<float> x, std::string* out,
                   absl::Span<float> sent) {
  const size_t n = x.size();
  // Eight independent partial sums: a loop the compiler vectorizes.
  float part[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) part[j] += std::fabs(x[i + j]);
  }
  double sum = 0;
  for (float p : part) sum += p;
  for (; i < n; ++i) sum += std::fabs(x[i]);
  const float scale = n == 0 ? 0.0f : static_cast<float>(sum / n);
  out->resize(sizeof(float) + (n + 7) / 8);
  std::memcpy(out->data(), &scale, sizeof(float));
  auto* bits = reinterpret_cast<unsigned char*>(out->data() + sizeof(float));
  for (size_t b = 0; b < (n + 7) / 8; ++b) {
    unsigned char byte = 0;
    const size_t end = std::min(n, 8 * b + 8);
    for (size_t e = 8 * b; e < end; ++e) {
      byte |= static_cast<unsigned char>(std::signbit(x[e])) << (e % 8);
    }
    bits[b] = byte;
  }
  if (!sent.empty()) {
    for (size_t e = 0; e < n; ++e) sent[e] = std::copysign(scale, x[e]);
  }
  for (size_t e = 0; e < n; ++e) x[e] -= std::copysign(scale, x[e]);
}

// bf16 of `x` into `out` (round to nearest, ties to even, as
// common/wire_dtype.h; `x` finite); `x` is left with x - the rounded
// value. One pass, in chunks the compiler vectorizes.
void Bf16InPlace(absl::Span<float> x, std::string* out) {
  constexpr size_t kChunk = 512;
  out->resize(x.size() * sizeof(uint16_t));
  uint16_t buf[kChunk];
  for (size_t i = 0; i < x.size(); i += kChunk) {
    const size_t n = std::min(kChunk, x.size() - i);
    float* __restrict in = x.data() + i;
    for (size_t k = 0; k < n; ++k) {
      uint32_t u;
      std::memcpy(&u, &in[k], sizeof(u));
      const uint32_t h = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
      buf[k] = static_cast<uint16_t>(h);
      const uint32_t back = h << 16;
      float rounded;
      std::memcpy(&rounded, &back, sizeof(rounded));
      in[k] -= rounded;
    }
    std::memcpy(out->data() + sizeof(uint16_t) * i, buf, sizeof(uint16_t) * n);
  }
}

}  // namespace

void EncodeTopK(absl::Span<const float> values, double ratio, std::string* out,
                absl::Span<float> sent) {
  std::vector<float> x(values.begin(), values.end());
  TopKInPlace(absl::MakeSpan(x), ratio, out, sent);
}

void EncodeOneBit(absl::Span<const float> values, std::string* out,
                  absl::Span<float> sent) {
  std::vector<float> x(values.begin(), values.end());
  OneBitInPlace(absl::MakeSpan(x), out, sent);
}

bool IsCompressedDtype(int dtype) {
  return dtype == v1::DTYPE_TOPK || dtype == v1::DTYPE_ONEBIT;
}

absl::Status DecodeCompressed(v1::DType dtype, absl::string_view bytes,
                              absl::Span<float> out) {
  const size_t n = out.size();
  if (dtype == v1::DTYPE_ONEBIT) {
    const size_t want = sizeof(float) + (n + 7) / 8;
    if (bytes.size() != want) {
      return absl::InvalidArgumentError(
          absl::StrCat("a one-bit payload of ", bytes.size(), " bytes; ", n,
                       " elements need ", want));
    }
    const float scale = Read<float>(bytes, 0);
    if (!std::isfinite(scale) || scale < 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a one-bit payload's scale is ", scale, " (want finite, >= 0)"));
    }
    const auto* bits =
        reinterpret_cast<const unsigned char*>(bytes.data() + sizeof(float));
    // The scale with its sign bit set from the element's bit.
    uint32_t magnitude;
    std::memcpy(&magnitude, &scale, sizeof(float));
    for (size_t i = 0; i < n; ++i) {
      const uint32_t v =
          magnitude |
          (static_cast<uint32_t>((bits[i / 8] >> (i % 8)) & 1) << 31);
      std::memcpy(&out[i], &v, sizeof(float));
    }
    return absl::OkStatus();
  }
  if (dtype != v1::DTYPE_TOPK) {
    return absl::InvalidArgumentError(
        absl::StrCat("dtype ", v1::DType_Name(dtype), " is not compressed"));
  }
  if (bytes.size() < sizeof(uint32_t)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a top-k payload of ", bytes.size(), " bytes has no count"));
  }
  const size_t k = Read<uint32_t>(bytes, 0);
  const size_t want = sizeof(uint32_t) + k * (sizeof(uint32_t) + sizeof(float));
  if (k > n || bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a top-k payload says ", k, " of ", n, " elements in ", bytes.size(),
        " bytes (", k, " elements need ", want, ")"));
  }
  std::fill(out.begin(), out.end(), 0.0f);
  const size_t values = sizeof(uint32_t) * (1 + k);
  int64_t last = -1;
  for (size_t j = 0; j < k; ++j) {
    const uint32_t i = Read<uint32_t>(bytes, sizeof(uint32_t) * (1 + j));
    if (i >= n || static_cast<int64_t>(i) <= last) {
      return absl::InvalidArgumentError(absl::StrCat(
          "a top-k payload's index ", i, " (entry ", j, ") is ",
          i >= n ? absl::StrCat("outside the slice's ", n, " elements")
                 : "not above the one before it (indices must ascend, once "
                   "each)"));
    }
    last = i;
    const float v = Read<float>(bytes, values + sizeof(float) * j);
    if (!std::isfinite(v)) {
      return absl::InvalidArgumentError(
          absl::StrCat("a top-k payload's value for element ", i, " is ", v));
    }
    out[i] = v;
  }
  return absl::OkStatus();
}

namespace {

// The dtype a compression's payloads travel as.
v1::DType PayloadDtype(Compression::Kind kind) {
  switch (kind) {
    case Compression::kBf16:
      return v1::DTYPE_BF16;
    case Compression::kF16:
      return v1::DTYPE_F16;
    case Compression::kTopK:
      return v1::DTYPE_TOPK;
    default:
      return v1::DTYPE_ONEBIT;
  }
}

}  // namespace

void Compressor::Encode(int slice, absl::Span<const float> grad,
                        v1::DType fallback, v1::SliceData* d, bool again) {
  if (c_.kind == Compression::kNone) {
    d->set_dtype(fallback);
    EncodeTensor(fallback, grad, d->mutable_data());
    return;
  }
  SliceState* state;
  {
    absl::MutexLock lock(&mu_);
    state = &slices_[slice];  // A node map: the state stays where it is.
  }
  // One call pushes a slice at a time: its state is this call's.
  d->set_dtype(PayloadDtype(c_.kind));
  if (again && !state->last.empty()) {
    *d->mutable_data() = state->last;
    return;
  }
  // The gradient goes into the residual, which keeps what the encoding
  // leaves out.
  std::vector<float>& x = state->residual;
  x.resize(grad.size(), 0.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] += grad[i];
  switch (c_.kind) {
    case Compression::kBf16:
      Bf16InPlace(absl::MakeSpan(x), d->mutable_data());
      break;
    case Compression::kF16: {
      EncodeTensor(v1::DTYPE_F16, x, d->mutable_data());
      std::vector<float> sent(x.size());
      DecodeTensor(v1::DTYPE_F16, d->data(), absl::MakeSpan(sent));
      for (size_t i = 0; i < x.size(); ++i) x[i] -= sent[i];
      break;
    }
    case Compression::kTopK:
      TopKInPlace(absl::MakeSpan(x), c_.ratio, d->mutable_data(), {});
      break;
    default:
      OneBitInPlace(absl::MakeSpan(x), d->mutable_data(), {});
  }
  state->last = d->data();
}

std::vector<float> Compressor::Residual(int slice) {
  absl::MutexLock lock(&mu_);
  auto it = slices_.find(slice);
  return it == slices_.end() ? std::vector<float>() : it->second.residual;
}

}  // namespace asyncps
