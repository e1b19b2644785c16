// Tensor payloads in any wire dtype (f32, bf16, f16): workers may send
// gradients and receive weights in 16 bits while the servers keep f32 master
// weights and optimizer state. Encoding rounds to nearest, ties to even;
// values too large for f16 become ±Inf (which the servers refuse, as they
// refuse any non-finite gradient); NaN stays NaN.
#ifndef ASYNCPS_COMMON_WIRE_DTYPE_H_
#define ASYNCPS_COMMON_WIRE_DTYPE_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// True for the dtypes payloads may travel in: F32, BF16, F16.
inline bool IsWireDtype(int dtype) {
  return dtype == v1::DTYPE_F32 || dtype == v1::DTYPE_BF16 ||
         dtype == v1::DTYPE_F16;
}

// f32 <-> bf16 / f16, one value.
uint16_t FloatToBf16(float f);
float Bf16ToFloat(uint16_t h);
uint16_t FloatToF16(float f);
float F16ToFloat(uint16_t h);

// Writes `values` in `dtype` (F32, BF16 or F16) into `out`.
// REQUIRES: dtype is one of those three.
void EncodeTensor(v1::DType dtype, absl::Span<const float> values,
                  std::string* out);

// Reads `bytes` of `dtype` into `out`.
// REQUIRES: bytes.size() == out.size() * DTypeSize(dtype).
void DecodeTensor(v1::DType dtype, absl::string_view bytes,
                  absl::Span<float> out);

// The index of the first NaN or Inf in `values`, or -1 if all are finite.
// Vectorized (one pass over the exponent bits), for validating payloads.
int64_t FirstNonFinite(absl::Span<const float> values);

// "f32", "bf16", "f16" (--wire_dtype) to the dtype; INVALID_ARGUMENT
// naming --wire_dtype otherwise.
absl::StatusOr<v1::DType> ParseWireDtype(absl::string_view text);
// The reverse: "f32", "bf16", "f16" ("" for any other dtype).
std::string WireDtypeName(v1::DType dtype);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_WIRE_DTYPE_H_
