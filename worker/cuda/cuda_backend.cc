#include "worker/cuda/cuda_backend.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/parallel.h"
#include "glog/logging.h"
#include "worker/cuda/kernels.h"

// A CUDA or cuBLAS failure after setup means the device is gone or the
// program is wrong; neither can be answered by carrying on.
#define CUDA_CHECK(expr)                                                     \
  do {                                                                       \
    cudaError_t err_ = (expr);                                               \
    CHECK(err_ == cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (false)
#define CUBLAS_CHECK(expr)                              \
  do {                                                  \
    cublasStatus_t st_ = (expr);                        \
    CHECK(st_ == CUBLAS_STATUS_SUCCESS)                 \
        << #expr << ": " << cublasGetStatusString(st_); \
  } while (false)

namespace asyncps {
namespace {

// Copies between pageable memory and a pinned staging buffer. One thread
// moves 5-7 GB/s (measured on an H200 machine: docs/GPU.md), far below the
// bus, and a wide model's step copies hundreds of MB each way; so a large
// copy is split over threads, each at least kCopyChunk.
void StagingCopy(void* dst, const void* src, size_t bytes) {
  constexpr size_t kCopyChunk = size_t{8} << 20;
  const size_t parts = std::max<size_t>(1, bytes / kCopyChunk);
  const size_t each = (bytes + parts - 1) / parts;
  ParallelFor(parts, ParallelThreads(), [&](size_t p) {
    const size_t at = p * each;
    std::memcpy(static_cast<char*>(dst) + at,
                static_cast<const char*>(src) + at, std::min(each, bytes - at));
  });
}

// A pinned host buffer for one copy in flight.
struct Staging {
  void* pinned = nullptr;
  size_t capacity = 0;
  cudaEvent_t done = nullptr;
  void* host = nullptr;  // Download target, copied to on WaitDownload.
  size_t bytes = 0;
  bool busy = false;
  bool upload = false;  // Released once `done` has fired.
};

class CudaBackend final : public Backend {
 public:
  CudaBackend(int device, GemmPrecision precision)
      : device_(device), precision_(precision) {
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&compute_, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&copy_, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasCreate(&cublas_));
    CUBLAS_CHECK(cublasSetStream(cublas_, compute_));
    CUBLAS_CHECK(cublasSetMathMode(cublas_, precision_ == GemmPrecision::kFp32
                                                ? CUBLAS_PEDANTIC_MATH
                                                : CUBLAS_DEFAULT_MATH));
    CUDA_CHECK(cudaMalloc(&scalars_, sizeof(double) + sizeof(uint64_t)));
    CUDA_CHECK(
        cudaMallocHost(&host_scalars_, sizeof(double) + sizeof(uint64_t)));
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, device_));
    name_ = absl::StrCat("cuda:", device_, " (", prop.name, ", cuBLAS ",
                         precision_ == GemmPrecision::kFp32   ? "fp32"
                         : precision_ == GemmPrecision::kTf32 ? "tf32"
                                                              : "bf16",
                         ")");
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(copy_);
    cudaStreamSynchronize(compute_);
    for (Staging& s : staging_) {
      cudaFreeHost(s.pinned);
      cudaEventDestroy(s.done);
    }
    cudaFree(bf16_a_);
    cudaFree(bf16_b_);
    cudaFree(scalars_);
    cudaFreeHost(host_scalars_);
    cublasDestroy(cublas_);
    cudaStreamDestroy(copy_);
    cudaStreamDestroy(compute_);
  }

  std::string Name() const override { return name_; }
  int cuda_device() const override { return device_; }

  void* AllocBytes(size_t bytes) override {
    void* p = nullptr;
    CUDA_CHECK(cudaMalloc(&p, std::max<size_t>(bytes, 1)));
    CUDA_CHECK(cudaMemset(p, 0, std::max<size_t>(bytes, 1)));
    return p;
  }
  void FreeBytes(void* p) override {
    cudaStreamSynchronize(compute_);
    cudaFree(p);
  }

  // Host -> pinned -> device on the copy stream; the compute stream waits
  // for the copy, the host does not.
  void Upload(const void* host, void* dst, size_t bytes) override {
    if (bytes == 0) return;
    const int i = Acquire(bytes);
    Staging& s = staging_[i];
    s.upload = true;
    StagingCopy(s.pinned, host, bytes);
    CUDA_CHECK(
        cudaMemcpyAsync(dst, s.pinned, bytes, cudaMemcpyHostToDevice, copy_));
    CUDA_CHECK(cudaEventRecord(s.done, copy_));
    CUDA_CHECK(cudaStreamWaitEvent(compute_, s.done, 0));
  }

  void Download(const void* src, void* host, size_t bytes) override {
    WaitDownload(DownloadAsync(src, host, bytes));
  }

  int64_t DownloadAsync(const void* src, void* host, size_t bytes) override {
    const int i = Acquire(bytes);
    Staging& s = staging_[i];
    s.upload = false;
    s.host = host;
    s.bytes = bytes;
    // The copy waits for the kernels queued so far, not for later ones.
    CUDA_CHECK(cudaEventRecord(s.done, compute_));
    CUDA_CHECK(cudaStreamWaitEvent(copy_, s.done, 0));
    if (bytes > 0) {
      CUDA_CHECK(
          cudaMemcpyAsync(s.pinned, src, bytes, cudaMemcpyDeviceToHost, copy_));
    }
    CUDA_CHECK(cudaEventRecord(s.done, copy_));
    return i;
  }

  void WaitDownload(int64_t ticket) override {
    Staging& s = staging_[ticket];
    CUDA_CHECK(cudaEventSynchronize(s.done));
    if (s.bytes > 0) StagingCopy(s.host, s.pinned, s.bytes);
    s.busy = false;
  }

  void Synchronize() override {
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    CUDA_CHECK(cudaStreamSynchronize(copy_));
  }

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T.
    const cublasOperation_t op_a = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const int lda = trans_a ? m : k;
    const int ldb = trans_b ? k : n;
    if (precision_ == GemmPrecision::kBf16) {
      const size_t size_a = static_cast<size_t>(m) * k;
      const size_t size_b = static_cast<size_t>(k) * n;
      Reserve(&bf16_a_, &bf16_a_cap_, size_a * 2);
      Reserve(&bf16_b_, &bf16_b_cap_, size_b * 2);
      cuda::ToBf16(a, bf16_a_, size_a, compute_);
      cuda::ToBf16(b, bf16_b_, size_b, compute_);
      CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, bf16_b_,
                                CUDA_R_16BF, ldb, bf16_a_, CUDA_R_16BF, lda,
                                &beta, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F,
                                CUBLAS_GEMM_DEFAULT));
      return;
    }
    const cublasComputeType_t compute = precision_ == GemmPrecision::kTf32
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    CUBLAS_CHECK(cublasGemmEx(cublas_, op_b, op_a, n, m, k, &alpha, b,
                              CUDA_R_32F, ldb, a, CUDA_R_32F, lda, &beta, c,
                              CUDA_R_32F, n, compute, CUBLAS_GEMM_DEFAULT));
  }

  void AddBias(float* x, const float* bias, int rows, int cols) override {
    cuda::AddBias(x, bias, rows, cols, compute_);
  }
  void Relu(const float* z, float* h, size_t n) override {
    cuda::Relu(z, h, n, compute_);
  }
  void ReluBackward(const float* z, const float* dh, float* dz,
                    size_t n) override {
    cuda::ReluBackward(z, dh, dz, n, compute_);
  }

  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                           int cols, float grad_scale, float* dlogits,
                           double* loss_sum, int64_t* correct) override {
    auto* loss = static_cast<double*>(scalars_);
    auto* right = reinterpret_cast<unsigned long long*>(loss + 1);
    CUDA_CHECK(cudaMemsetAsync(scalars_, 0, sizeof(double) + sizeof(uint64_t),
                               compute_));
    cuda::SoftmaxCrossEntropy(logits, labels, rows, cols, grad_scale, dlogits,
                              loss, right, compute_);
    CUDA_CHECK(cudaMemcpyAsync(host_scalars_, scalars_,
                               sizeof(double) + sizeof(uint64_t),
                               cudaMemcpyDeviceToHost, compute_));
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    *loss_sum = *static_cast<double*>(host_scalars_);
    *correct = static_cast<int64_t>(*reinterpret_cast<unsigned long long*>(
        static_cast<double*>(host_scalars_) + 1));
  }

  void ColumnSum(const float* x, int rows, int cols, float beta,
                 float* out) override {
    cuda::ColumnSum(x, rows, cols, beta, out, compute_);
  }

 private:
  // A free staging buffer of at least `bytes`.
  int Acquire(size_t bytes) {
    int best = -1;
    for (size_t i = 0; i < staging_.size(); ++i) {
      Staging& s = staging_[i];
      if (s.busy && s.upload && cudaEventQuery(s.done) == cudaSuccess) {
        s.busy = false;
      }
      if (!s.busy && s.capacity >= bytes) {
        best = static_cast<int>(i);
        break;
      }
    }
    if (best < 0) {
      staging_.emplace_back();
      Staging& s = staging_.back();
      s.capacity = std::max<size_t>(bytes, 4096);
      CUDA_CHECK(cudaMallocHost(&s.pinned, s.capacity));
      CUDA_CHECK(cudaEventCreateWithFlags(&s.done, cudaEventDisableTiming));
      best = static_cast<int>(staging_.size()) - 1;
    }
    staging_[best].busy = true;
    return best;
  }

  void Reserve(void** buf, size_t* cap, size_t bytes) {
    if (*cap >= bytes) return;
    CUDA_CHECK(cudaStreamSynchronize(compute_));
    cudaFree(*buf);
    CUDA_CHECK(cudaMalloc(buf, bytes));
    *cap = bytes;
  }

  const int device_;
  const GemmPrecision precision_;
  std::string name_;
  cudaStream_t compute_ = nullptr;
  cudaStream_t copy_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* scalars_ = nullptr;
  void* host_scalars_ = nullptr;
  void* bf16_a_ = nullptr;
  void* bf16_b_ = nullptr;
  size_t bf16_a_cap_ = 0;
  size_t bf16_b_cap_ = 0;
  std::vector<Staging> staging_;
};

}  // namespace

int CudaDeviceCount(std::string* why) {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    if (why != nullptr) *why = cudaGetErrorString(err);
    return 0;
  }
  if (n == 0 && why != nullptr) *why = "no CUDA device";
  return n;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCudaBackend(
    int device, GemmPrecision precision) {
  std::string why;
  const int n = CudaDeviceCount(&why);
  if (device < 0 || device >= n) {
    return absl::FailedPreconditionError(
        absl::StrCat("cuda:", device, " is not available (", n, " CUDA devices",
                     why.empty() ? "" : absl::StrCat(": ", why), ")"));
  }
  return std::unique_ptr<Backend>(new CudaBackend(device, precision));
}

}  // namespace asyncps
