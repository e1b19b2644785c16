// Backend: the compute seam of a worker. Every kernel the models need (GEMM,
// bias, activation, loss, reductions) and the memory they run on. The CPU
// backend (worker/cpu/) runs on OpenBLAS; the CUDA backend (worker/cuda/) on
// cuBLAS and kernels of our own. Pointers passed to kernels are in the
// backend's memory (host for CPU, device for CUDA); Upload and Download move
// data across. Matrices are row-major. A backend is used by one thread.
#ifndef ASYNCPS_WORKER_BACKEND_H_
#define ASYNCPS_WORKER_BACKEND_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/types/span.h"

namespace asyncps {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string Name() const = 0;
  // The CUDA device this backend computes on, or -1 for the CPU.
  virtual int cuda_device() const { return -1; }

  // Memory. Alloc returns zeroed memory for n elements; never null.
  virtual void* AllocBytes(size_t bytes) = 0;
  virtual void FreeBytes(void* p) = 0;
  virtual void Upload(const void* host, void* dst, size_t bytes) = 0;
  // Copies to the host; the data is there once Synchronize() returns (the
  // CPU backend copies at once).
  virtual void Download(const void* src, void* host, size_t bytes) = 0;
  virtual void Synchronize() = 0;
  // Starts copying to the host and returns a ticket; the data is in `host`
  // once WaitDownload(ticket) returns. Kernels launched in between may run
  // while the copy is in flight (the CUDA backend copies on its own stream
  // through pinned memory). `src` must not change until then.
  virtual int64_t DownloadAsync(const void* src, void* host, size_t bytes) {
    Download(src, host, bytes);
    return 0;
  }
  virtual void WaitDownload(int64_t ticket) { Synchronize(); }

  // c = alpha * op(a) * op(b) + beta * c, with op(a) m x k, op(b) k x n.
  virtual void Gemm(bool trans_a, bool trans_b, int m, int n, int k,
                    float alpha, const float* a, const float* b, float beta,
                    float* c) = 0;
  // x[r][c] += bias[c] for a rows x cols matrix.
  virtual void AddBias(float* x, const float* bias, int rows, int cols) = 0;
  // h = max(z, 0).
  virtual void Relu(const float* z, float* h, size_t n) = 0;
  // dz = dh where z > 0, else 0.
  virtual void ReluBackward(const float* z, const float* dh, float* dz,
                            size_t n) = 0;
  // Softmax cross-entropy of `logits` (rows x cols) against `labels`.
  // If `dlogits` is not null it gets d(mean loss)/d(logits), i.e.
  // (softmax - onehot) * grad_scale. Returns the summed loss and the number
  // of rows whose arg-max is the label (both on the host, synchronised).
  virtual void SoftmaxCrossEntropy(const float* logits, const int32_t* labels,
                                   int rows, int cols, float grad_scale,
                                   float* dlogits, double* loss_sum,
                                   int64_t* correct) = 0;
  // out[c] = beta * out[c] + sum over rows of x[r][c].
  virtual void ColumnSum(const float* x, int rows, int cols, float beta,
                         float* out) = 0;
};

// An array of T in a backend's memory, freed with it.
template <typename T>
class DeviceArray {
 public:
  DeviceArray() = default;
  DeviceArray(Backend* backend, size_t n)
      : backend_(backend),
        data_(static_cast<T*>(backend->AllocBytes(n * sizeof(T)))),
        size_(n) {}
  DeviceArray(DeviceArray&& o) noexcept { *this = std::move(o); }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    Reset();
    backend_ = o.backend_;
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
    return *this;
  }
  ~DeviceArray() { Reset(); }

  T* data() { return data_; }
  const T* data() const { return data_; }
  size_t size() const { return size_; }
  void Upload(absl::Span<const T> host) {
    backend_->Upload(host.data(), data_, host.size() * sizeof(T));
  }
  void Download(absl::Span<T> host) const {
    backend_->Download(data_, host.data(), host.size() * sizeof(T));
  }

 private:
  void Reset() {
    if (data_ != nullptr) backend_->FreeBytes(data_);
    data_ = nullptr;
  }
  Backend* backend_ = nullptr;
  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_BACKEND_H_
