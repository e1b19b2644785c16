// The CPU backend: GEMMs on OpenBLAS (cblas_sgemm), the rest as plain loops.
#ifndef ASYNCPS_WORKER_CPU_CPU_BACKEND_H_
#define ASYNCPS_WORKER_CPU_CPU_BACKEND_H_

#include <memory>

#include "worker/backend.h"

namespace asyncps {

// `blas_threads` sets OpenBLAS's thread count (process-wide); 0 leaves it.
std::unique_ptr<Backend> MakeCpuBackend(int blas_threads);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_CPU_CPU_BACKEND_H_
