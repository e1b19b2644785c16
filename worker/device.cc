#include "worker/device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "glog/logging.h"
#include "worker/cpu/cpu_backend.h"
#ifdef ASYNCPS_WITH_CUDA
#include "worker/cuda/cuda_backend.h"
#endif

namespace asyncps {

bool BuiltWithCuda() {
#ifdef ASYNCPS_WITH_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<std::unique_ptr<Backend>> MakeBackend(const std::string& device,
                                                     GemmPrecision precision,
                                                     int rank,
                                                     int blas_threads) {
  if (device == "cpu") {
    if (precision != GemmPrecision::kFp32) {
      return absl::InvalidArgumentError(
          "--precision=tf32 and bf16 need a CUDA device; the CPU runs fp32");
    }
    return MakeCpuBackend(blas_threads);
  }
  if (device == "auto") {
#ifdef ASYNCPS_WITH_CUDA
    std::string why;
    const int n = CudaDeviceCount(&why);
    if (n > 0) return MakeCudaBackend(rank % n, precision);
    LOG(INFO) << "--device=auto: no usable GPU (" << why
              << "); running on the CPU";
#else
    LOG(INFO) << "--device=auto: this build has no CUDA (build with "
                 "--config=cuda for GPUs); running on the CPU";
#endif
    if (precision != GemmPrecision::kFp32) {
      LOG(INFO) << "the CPU computes in fp32; --precision is ignored";
    }
    return MakeCpuBackend(blas_threads);
  }
  ASSIGN_OR_RETURN(const int index, ParseDevice(device));
#ifdef ASYNCPS_WITH_CUDA
  return MakeCudaBackend(index, precision);
#else
  (void)index;
  return absl::InternalError("unreachable: ParseDevice refuses cuda:N");
#endif
}

absl::StatusOr<int> ParseDevice(const std::string& device) {
  if (device == "auto") return -2;
  if (device == "cpu") return -1;
  int index = -1;
  if (device.rfind("cuda:", 0) != 0 ||
      !absl::SimpleAtoi(device.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--device=", device, " (want auto, cpu or cuda:N)"));
  }
  if (!BuiltWithCuda()) {
    return absl::FailedPreconditionError(
        absl::StrCat("--device=", device,
                     ": this ps_worker was built without CUDA (build with "
                     "--config=cuda)"));
  }
  return index;
}

}  // namespace asyncps
