// Our own CUDA kernels for the MLP (cuBLAS does the GEMMs). Each launches on
// `stream` and returns at once; pointers are device memory, matrices
// row-major.
#ifndef ASYNCPS_WORKER_CUDA_KERNELS_H_
#define ASYNCPS_WORKER_CUDA_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace asyncps::cuda {

// x[r][c] += bias[c].
void AddBias(float* x, const float* bias, int rows, int cols,
             cudaStream_t stream);
// h = max(z, 0).
void Relu(const float* z, float* h, size_t n, cudaStream_t stream);
// dz = z > 0 ? dh : 0.
void ReluBackward(const float* z, const float* dh, float* dz, size_t n,
                  cudaStream_t stream);
// Per row: loss += logsumexp(z) - z[label]; correct += argmax == label;
// if dlogits: dlogits = (softmax - onehot) * grad_scale. `loss` and
// `correct` are device scalars the caller zeroes first.
void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                         int cols, float grad_scale, float* dlogits,
                         double* loss, unsigned long long* correct,
                         cudaStream_t stream);
// out[c] = beta * out[c] + sum_r x[r][c].
void ColumnSum(const float* x, int rows, int cols, float beta, float* out,
               cudaStream_t stream);
// dst = bf16(src), round to nearest even. dst points at n 16-bit values.
void ToBf16(const float* src, void* dst, size_t n, cudaStream_t stream);

}  // namespace asyncps::cuda

#endif  // ASYNCPS_WORKER_CUDA_KERNELS_H_
