#include "common/compress.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

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
      "--compress=", text, " (want none, bf16, topk:RATIO or onebit)"));
}

size_t TopKCount(size_t n, double ratio) {
  if (n == 0) return 0;
  const double k = std::ceil(ratio * static_cast<double>(n));
  return std::clamp<size_t>(static_cast<size_t>(k), 1, n);
}

void EncodeTopK(absl::Span<const float> values, double ratio, std::string* out,
                absl::Span<float> sent) {
  const size_t n = values.size();
  const size_t k = TopKCount(n, ratio);
  std::vector<uint32_t> order(n);
  std::iota(order.begin(), order.end(), 0u);
  // Larger magnitude first; equal magnitudes: the lower index first. A
  // strict total order, so the k chosen do not depend on the algorithm.
  auto before = [&](uint32_t a, uint32_t b) {
    const float x = std::fabs(values[a]), y = std::fabs(values[b]);
    return x > y || (x == y && a < b);
  };
  if (k < n)
    std::nth_element(order.begin(), order.begin() + k, order.end(), before);
  order.resize(k);
  std::sort(order.begin(), order.end());
  out->clear();
  out->reserve(sizeof(uint32_t) + k * (sizeof(uint32_t) + sizeof(float)));
  Append(out, static_cast<uint32_t>(k));
  for (uint32_t i : order) Append(out, i);
  for (uint32_t i : order) Append(out, values[i]);
  std::fill(sent.begin(), sent.end(), 0.0f);
  for (uint32_t i : order) sent[i] = values[i];
}

void EncodeOneBit(absl::Span<const float> values, std::string* out,
                  absl::Span<float> sent) {
  const size_t n = values.size();
  double sum = 0;
  for (float v : values) sum += std::fabs(v);
  const float scale = n == 0 ? 0.0f : static_cast<float>(sum / n);
  out->assign(sizeof(float) + (n + 7) / 8, '\0');
  std::memcpy(out->data(), &scale, sizeof(float));
  char* bits = out->data() + sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    const bool negative = std::signbit(values[i]);
    if (negative) bits[i / 8] = static_cast<char>(bits[i / 8] | (1 << (i % 8)));
    sent[i] = negative ? -scale : scale;
  }
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
    const char* bits = bytes.data() + sizeof(float);
    for (size_t i = 0; i < n; ++i) {
      out[i] = (bits[i / 8] >> (i % 8)) & 1 ? -scale : scale;
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

void Compressor::Encode(int slice, absl::Span<const float> grad,
                        v1::DType fallback, v1::SliceData* d) {
  if (c_.kind == Compression::kNone) {
    d->set_dtype(fallback);
    EncodeTensor(fallback, grad, d->mutable_data());
    return;
  }
  std::vector<float>* r;
  {
    absl::MutexLock lock(&mu_);
    r = &residual_[slice];  // A node map: the vector stays where it is.
  }
  // One call pushes a slice at a time: its residual is this call's.
  r->resize(grad.size(), 0.0f);
  std::vector<float>& x = *r;
  for (size_t i = 0; i < x.size(); ++i) x[i] += grad[i];
  std::vector<float> sent(x.size());
  switch (c_.kind) {
    case Compression::kBf16:
      d->set_dtype(v1::DTYPE_BF16);
      EncodeTensor(v1::DTYPE_BF16, x, d->mutable_data());
      DecodeTensor(v1::DTYPE_BF16, d->data(), absl::MakeSpan(sent));
      break;
    case Compression::kTopK:
      d->set_dtype(v1::DTYPE_TOPK);
      EncodeTopK(x, c_.ratio, d->mutable_data(), absl::MakeSpan(sent));
      break;
    default:
      d->set_dtype(v1::DTYPE_ONEBIT);
      EncodeOneBit(x, d->mutable_data(), absl::MakeSpan(sent));
  }
  for (size_t i = 0; i < x.size(); ++i) x[i] -= sent[i];
}

std::vector<float> Compressor::Residual(int slice) {
  absl::MutexLock lock(&mu_);
  auto it = residual_.find(slice);
  return it == residual_.end() ? std::vector<float>() : it->second;
}

}  // namespace asyncps
