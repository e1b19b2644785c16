#include "worker/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

namespace asyncps {
namespace {

class CpuBackend final : public Backend {
 public:
  std::string Name() const override { return "cpu (OpenBLAS)"; }

  void* AllocBytes(size_t bytes) override {
    return std::calloc(std::max<size_t>(bytes, 1), 1);
  }
  void FreeBytes(void* p) override { std::free(p); }
  void Upload(const void* host, void* dst, size_t bytes) override {
    if (bytes > 0) std::memcpy(dst, host, bytes);
  }
  void Download(const void* src, void* host, size_t bytes) override {
    if (bytes > 0) std::memcpy(host, src, bytes);
  }
  void Synchronize() override {}

  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, m, n, k, alpha, a,
                trans_a ? m : k, b, trans_b ? k : n, beta, c, n);
  }

  void AddBias(float* x, const float* bias, int rows, int cols) override {
    for (int r = 0; r < rows; ++r) {
      float* row = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) row[c] += bias[c];
    }
  }

  // The element-wise kernels take __restrict pointers (the buffers never
  // overlap) so that -O3 vectorizes them; same bits as scalar loops.
  void Relu(const float* z_in, float* h_out, size_t n) override {
    const float* __restrict z = z_in;
    float* __restrict h = h_out;
    for (size_t i = 0; i < n; ++i) h[i] = z[i] > 0 ? z[i] : 0.0f;
  }

  void ReluBackward(const float* z_in, const float* dh_in, float* dz_out,
                    size_t n) override {
    const float* __restrict z = z_in;
    const float* __restrict dh = dh_in;
    float* __restrict dz = dz_out;
    for (size_t i = 0; i < n; ++i) dz[i] = z[i] > 0 ? dh[i] : 0.0f;
  }

  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                           int cols, float grad_scale, float* dlogits,
                           double* loss_sum, int64_t* correct) override {
    double loss = 0;
    int64_t right = 0;
    for (int r = 0; r < rows; ++r) {
      const float* z = logits + static_cast<size_t>(r) * cols;
      const int label = labels[r];
      int best = 0;
      float max = z[0];
      for (int c = 1; c < cols; ++c) {
        if (z[c] > max) {
          max = z[c];
          best = c;
        }
      }
      double sum = 0;
      for (int c = 0; c < cols; ++c) sum += std::exp(double{z[c]} - max);
      const double log_sum = std::log(sum) + max;
      loss += log_sum - z[label];
      right += best == label;
      if (dlogits != nullptr) {
        float* d = dlogits + static_cast<size_t>(r) * cols;
        for (int c = 0; c < cols; ++c) {
          const double p = std::exp(double{z[c]} - log_sum);
          d[c] =
              static_cast<float>((p - (c == label ? 1.0 : 0.0)) * grad_scale);
        }
      }
    }
    *loss_sum = loss;
    *correct = right;
  }

  void ColumnSum(const float* x, int rows, int cols, float beta,
                 float* out) override {
    for (int c = 0; c < cols; ++c) out[c] *= beta;
    for (int r = 0; r < rows; ++r) {
      const float* row = x + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) out[c] += row[c];
    }
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int blas_threads) {
  if (blas_threads > 0) openblas_set_num_threads(blas_threads);
  return std::make_unique<CpuBackend>();
}

}  // namespace asyncps
