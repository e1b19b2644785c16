#include <cuda_bf16.h>

#include "worker/cuda/kernels.h"

namespace asyncps::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(size_t n) {
  size_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 64 ? b : 65535 * 64);
}

__global__ void AddBiasKernel(float* x, const float* bias, size_t n, int cols) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{blockDim.x} * gridDim.x) {
    x[i] += bias[i % cols];
  }
}

__global__ void ReluKernel(const float* z, float* h, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{blockDim.x} * gridDim.x) {
    h[i] = z[i] > 0.0f ? z[i] : 0.0f;
  }
}

__global__ void ReluBackwardKernel(const float* z, const float* dh, float* dz,
                                   size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{blockDim.x} * gridDim.x) {
    dz[i] = z[i] > 0.0f ? dh[i] : 0.0f;
  }
}

// One thread per row: the MLP's output rows are short (classes).
__global__ void SoftmaxCrossEntropyKernel(const float* logits,
                                          const int32_t* labels, int rows,
                                          int cols, float grad_scale,
                                          float* dlogits, double* loss,
                                          unsigned long long* correct) {
  const int r = blockIdx.x * blockDim.x + threadIdx.x;
  if (r >= rows) return;
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
  for (int c = 0; c < cols; ++c) sum += exp(static_cast<double>(z[c]) - max);
  const double log_sum = log(sum) + max;
  atomicAdd(loss, log_sum - z[label]);
  if (best == label) atomicAdd(correct, 1ull);
  if (dlogits != nullptr) {
    float* d = dlogits + static_cast<size_t>(r) * cols;
    for (int c = 0; c < cols; ++c) {
      const double p = exp(static_cast<double>(z[c]) - log_sum);
      d[c] = static_cast<float>((p - (c == label ? 1.0 : 0.0)) * grad_scale);
    }
  }
}

// One thread per column; neighbouring threads read neighbouring addresses.
__global__ void ColumnSumKernel(const float* x, int rows, int cols, float beta,
                                float* out) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float acc = 0.0f;
  for (int r = 0; r < rows; ++r) acc += x[static_cast<size_t>(r) * cols + c];
  out[c] = (beta == 0.0f ? 0.0f : beta * out[c]) + acc;
}

__global__ void ToBf16Kernel(const float* src, __nv_bfloat16* dst, size_t n) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n;
       i += size_t{blockDim.x} * gridDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

}  // namespace

void AddBias(float* x, const float* bias, int rows, int cols,
             cudaStream_t stream) {
  const size_t n = static_cast<size_t>(rows) * cols;
  if (n == 0) return;
  AddBiasKernel<<<Blocks(n), kThreads, 0, stream>>>(x, bias, n, cols);
}

void Relu(const float* z, float* h, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ReluKernel<<<Blocks(n), kThreads, 0, stream>>>(z, h, n);
}

void ReluBackward(const float* z, const float* dh, float* dz, size_t n,
                  cudaStream_t stream) {
  if (n == 0) return;
  ReluBackwardKernel<<<Blocks(n), kThreads, 0, stream>>>(z, dh, dz, n);
}

void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                         int cols, float grad_scale, float* dlogits,
                         double* loss, unsigned long long* correct,
                         cudaStream_t stream) {
  if (rows == 0) return;
  SoftmaxCrossEntropyKernel<<<(rows + kThreads - 1) / kThreads, kThreads, 0,
                              stream>>>(logits, labels, rows, cols, grad_scale,
                                        dlogits, loss, correct);
}

void ColumnSum(const float* x, int rows, int cols, float beta, float* out,
               cudaStream_t stream) {
  if (cols == 0) return;
  ColumnSumKernel<<<(cols + kThreads - 1) / kThreads, kThreads, 0, stream>>>(
      x, rows, cols, beta, out);
}

void ToBf16(const float* src, void* dst, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  ToBf16Kernel<<<Blocks(n), kThreads, 0, stream>>>(
      src, static_cast<__nv_bfloat16*>(dst), n);
}

}  // namespace asyncps::cuda
