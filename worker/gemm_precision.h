// The precision a backend multiplies matrices in (--precision).
#ifndef ASYNCPS_WORKER_GEMM_PRECISION_H_
#define ASYNCPS_WORKER_GEMM_PRECISION_H_

#include <string>

#include "absl/status/statusor.h"

namespace asyncps {

enum class GemmPrecision {
  kFp32,  // IEEE f32 throughout.
  kTf32,  // f32 storage, TF32 tensor-core multiplies, f32 accumulation.
  kBf16,  // Operands rounded to bf16 for tensor cores, f32 accumulation and
          // output; the f32 master weights stay on the servers.
};

// "fp32", "tf32" or "bf16"; INVALID_ARGUMENT naming --precision otherwise.
absl::StatusOr<GemmPrecision> ParsePrecision(const std::string& text);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_GEMM_PRECISION_H_
