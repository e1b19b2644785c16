// Choosing the compute backend for --device=auto|cpu|cuda:N.
#ifndef ASYNCPS_WORKER_DEVICE_H_
#define ASYNCPS_WORKER_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend.h"

namespace asyncps {

enum class GemmPrecision {
  kFp32,  // IEEE f32 throughout.
  kTf32,  // f32 storage, TF32 tensor-core multiplies, f32 accumulation.
  kBf16,  // Operands rounded to bf16 for tensor cores, f32 accumulation and
          // output; the f32 master weights stay on the servers.
};

absl::StatusOr<GemmPrecision> ParsePrecision(const std::string& text);

// True if this binary was built with --config=cuda.
bool BuiltWithCuda();

// The backend for `device`:
// - "cpu": OpenBLAS (precision must be fp32);
// - "cuda:N": GPU N, or FAILED_PRECONDITION if there is none or this build
//   has no CUDA;
// - "auto": GPU (rank mod GPU count), so one worker per GPU on a machine, or
//   else the CPU, saying why in one log line.
absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device,
                                                     GemmPrecision precision,
                                                     int rank,
                                                     int blas_threads);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_DEVICE_H_
