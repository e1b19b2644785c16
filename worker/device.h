// Choosing the compute backend for --device=auto|cpu|cuda:N.
#ifndef ASYNCPS_WORKER_DEVICE_H_
#define ASYNCPS_WORKER_DEVICE_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend.h"
#include "worker/gemm_precision.h"

namespace asyncps {

// -2 for "auto", -1 for "cpu", N for "cuda:N"; INVALID_ARGUMENT naming
// --device for anything else, FAILED_PRECONDITION for cuda:N in a build
// without CUDA.
absl::StatusOr<int> ParseDevice(const std::string& device);

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
