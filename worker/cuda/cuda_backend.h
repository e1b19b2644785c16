// The CUDA backend: GEMMs with cuBLAS (cublasGemmEx), everything else with
// our kernels (worker/cuda/kernels.cu). One stream computes, another copies
// through pinned host buffers, so gradients go to the host while the next
// layer's backward runs. Used by one thread.
#ifndef ASYNCPS_WORKER_CUDA_CUDA_BACKEND_H_
#define ASYNCPS_WORKER_CUDA_CUDA_BACKEND_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/backend.h"
#include "worker/gemm_precision.h"

namespace asyncps {

// Number of usable CUDA devices; 0 (with `why` set, if not null) when there
// is no driver or no GPU.
int CudaDeviceCount(std::string* why);

// A backend on GPU `device`. FAILED_PRECONDITION if it does not exist.
absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, GemmPrecision precision);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_CUDA_CUDA_BACKEND_H_
