// Little-endian f32 payloads: the wire form of every tensor slice.
#ifndef ASYNCPS_COMMON_TENSOR_BYTES_H_
#define ASYNCPS_COMMON_TENSOR_BYTES_H_

#include <cstring>
#include <string>
#include <vector>

#include "absl/base/config.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace asyncps {

#if !defined(ABSL_IS_LITTLE_ENDIAN)
#error "asyncps assumes a little-endian host; add byte swapping here"
#endif

// Bytes of one f32 element on the wire.
inline constexpr size_t kF32Bytes = sizeof(float);

// Writes `values` as little-endian f32 into `out` (replacing its contents).
inline void EncodeF32(absl::Span<const float> values, std::string* out) {
  // assign, not resize + memcpy: no zeroing of bytes about to be written.
  out->assign(reinterpret_cast<const char*>(values.data()),
              values.size() * sizeof(float));
}

// Reads little-endian f32 from `bytes` into `out`.
// REQUIRES: bytes.size() == out.size() * kF32Bytes.
inline void DecodeF32(absl::string_view bytes, absl::Span<float> out) {
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
}

// Reads little-endian f32 from `bytes` into `out`, sized to fit; false
// (and `out` unspecified) if `bytes` is not a whole number of floats.
inline bool DecodeF32Vector(absl::string_view bytes, std::vector<float>* out) {
  if (bytes.size() % kF32Bytes != 0) return false;
  out->resize(bytes.size() / kF32Bytes);
  DecodeF32(bytes, absl::MakeSpan(*out));
  return true;
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_TENSOR_BYTES_H_
