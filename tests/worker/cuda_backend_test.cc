// The CUDA backend against the CPU backend: every kernel, the GEMM in each
// precision, and the MLP's gradients on the same batch. Built only with
// --config=cuda; skips, saying why, on a machine without a GPU.
#include "worker/cuda/cuda_backend.h"

#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/mlp.h"

namespace asyncps {
namespace {

// The CPU backend with every GEMM operand rounded to bf16 first (to nearest
// even, as the GPU's conversion kernel does) and f32 accumulation: the
// arithmetic the GPU's bf16 precision promises, so its gradients can be held
// to f32 accuracy rather than to bf16's error amplified by each tensor's
// cancellation.
class Bf16OperandsCpu : public Backend {
 public:
  Bf16OperandsCpu() : cpu_(MakeCpuBackend(1)) {}
  std::string Name() const override { return "cpu, bf16 operands"; }
  void* AllocBytes(size_t bytes) override { return cpu_->AllocBytes(bytes); }
  void FreeBytes(void* p) override { cpu_->FreeBytes(p); }
  void Upload(const void* host, void* dst, size_t bytes) override {
    cpu_->Upload(host, dst, bytes);
  }
  void Download(const void* src, void* host, size_t bytes) override {
    cpu_->Download(src, host, bytes);
  }
  void Synchronize() override { cpu_->Synchronize(); }
  void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha,
            const float* a, const float* b, float beta, float* c) override {
    // The CPU backend's device memory is host memory.
    const std::vector<float> ra = Rounded(a, size_t{1} * m * k);
    const std::vector<float> rb = Rounded(b, size_t{1} * k * n);
    cpu_->Gemm(trans_a, trans_b, m, n, k, alpha, ra.data(), rb.data(), beta, c);
  }
  void AddBias(float* x, const float* bias, int rows, int cols) override {
    cpu_->AddBias(x, bias, rows, cols);
  }
  void Relu(const float* z, float* h, size_t n) override {
    cpu_->Relu(z, h, n);
  }
  void ReluBackward(const float* z, const float* dh, float* dz,
                    size_t n) override {
    cpu_->ReluBackward(z, dh, dz, n);
  }
  void SoftmaxCrossEntropy(const float* logits, const int32_t* labels, int rows,
                           int cols, float grad_scale, float* dlogits,
                           double* loss, int64_t* correct) override {
    cpu_->SoftmaxCrossEntropy(logits, labels, rows, cols, grad_scale, dlogits,
                              loss, correct);
  }
  void ColumnSum(const float* x, int rows, int cols, float beta,
                 float* out) override {
    cpu_->ColumnSum(x, rows, cols, beta, out);
  }

 private:
  static std::vector<float> Rounded(const float* x, size_t n) {
    std::vector<float> r(n);
    for (size_t i = 0; i < n; ++i) r[i] = Bf16ToFloat(FloatToBf16(x[i]));
    return r;
  }

  std::unique_ptr<Backend> cpu_;
};

class CudaBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (CudaDeviceCount(&why) == 0) {
      GTEST_SKIP() << "no GPU on this machine (" << why
                   << "); CUDA tests skipped";
    }
    cpu_ = MakeCpuBackend(1);
  }

  std::unique_ptr<Backend> Gpu(GemmPrecision p = GemmPrecision::kFp32) {
    auto b = MakeCudaBackend(0, p);
    EXPECT_TRUE(b.ok()) << b.status();
    return b.ok() ? *std::move(b) : nullptr;
  }

  std::vector<float> Random(size_t n, float scale = 1.0f) {
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (float& x : v) x = d(rng_);
    return v;
  }

  // Runs `op` on a backend with inputs uploaded and returns the output.
  template <typename Op>
  std::vector<float> Run(Backend* b, const std::vector<std::vector<float>>& in,
                         size_t out_n, const std::vector<float>& out_init,
                         Op op) {
    std::vector<DeviceArray<float>> bufs;
    for (const auto& v : in) {
      bufs.emplace_back(b, v.size());
      bufs.back().Upload(v);
    }
    DeviceArray<float> out(b, out_n);
    if (!out_init.empty()) out.Upload(out_init);
    std::vector<const float*> ptrs;
    for (auto& d : bufs) ptrs.push_back(d.data());
    op(b, ptrs, out.data());
    std::vector<float> host(out_n);
    out.Download(absl::MakeSpan(host));
    b->Synchronize();
    return host;
  }

  static double RelError(const std::vector<float>& got,
                         const std::vector<float>& want) {
    double num = 0, den = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      num += (got[i] - want[i]) * double{got[i] - want[i]};
      den += want[i] * double{want[i]};
    }
    return std::sqrt(num / std::max(den, 1e-30));
  }

  std::mt19937 rng_{11};
  std::unique_ptr<Backend> cpu_;
};

TEST_F(CudaBackendTest, ElementwiseKernelsMatchCpu) {
  auto gpu = Gpu();
  const int rows = 37, cols = 129;
  const auto x = Random(rows * cols), bias = Random(cols),
             dh = Random(rows * cols);
  auto bias_op = [&](Backend* b, std::vector<const float*> p, float* out) {
    b->AddBias(out, p[0], rows, cols);
  };
  EXPECT_EQ(Run(gpu.get(), {bias}, x.size(), x, bias_op),
            Run(cpu_.get(), {bias}, x.size(), x, bias_op));
  auto relu = [&](Backend* b, std::vector<const float*> p, float* out) {
    b->Relu(p[0], out, x.size());
  };
  EXPECT_EQ(Run(gpu.get(), {x}, x.size(), {}, relu),
            Run(cpu_.get(), {x}, x.size(), {}, relu));
  auto relu_back = [&](Backend* b, std::vector<const float*> p, float* out) {
    b->ReluBackward(p[0], p[1], out, x.size());
  };
  EXPECT_EQ(Run(gpu.get(), {x, dh}, x.size(), {}, relu_back),
            Run(cpu_.get(), {x, dh}, x.size(), {}, relu_back));
  auto colsum = [&](Backend* b, std::vector<const float*> p, float* out) {
    b->ColumnSum(p[0], rows, cols, 0.5f, out);
  };
  EXPECT_LT(RelError(Run(gpu.get(), {x}, cols, bias, colsum),
                     Run(cpu_.get(), {x}, cols, bias, colsum)),
            1e-6);
}

TEST_F(CudaBackendTest, SoftmaxCrossEntropyMatchesCpu) {
  auto gpu = Gpu();
  const int rows = 300, cols = 10;
  const auto logits = Random(rows * cols, 3.0f);
  std::vector<int32_t> labels(rows);
  for (int r = 0; r < rows; ++r) labels[r] = (r * 7) % cols;
  double loss[2];
  int64_t correct[2];
  std::vector<float> grads[2];
  Backend* backends[2] = {cpu_.get(), gpu.get()};
  for (int i = 0; i < 2; ++i) {
    Backend* b = backends[i];
    DeviceArray<float> z(b, logits.size()), d(b, logits.size());
    DeviceArray<int32_t> y(b, rows);
    z.Upload(logits);
    y.Upload(labels);
    b->SoftmaxCrossEntropy(z.data(), y.data(), rows, cols, 1.0f / rows,
                           d.data(), &loss[i], &correct[i]);
    grads[i].resize(logits.size());
    d.Download(absl::MakeSpan(grads[i]));
    b->Synchronize();
  }
  EXPECT_NEAR(loss[1], loss[0], 1e-9 * std::abs(loss[0]));
  EXPECT_EQ(correct[1], correct[0]);
  EXPECT_LT(RelError(grads[1], grads[0]), 1e-6);
}

TEST_F(CudaBackendTest, GemmEveryTransposeAndPrecision) {
  const int m = 65, n = 130, k = 257;
  const auto a = Random(m * k), b = Random(k * n), c0 = Random(m * n);
  struct Case {
    GemmPrecision p;
    double bound;
  };
  // TF32 and bf16 keep 10 and 7 mantissa bits of each operand.
  for (Case c :
       {Case{GemmPrecision::kFp32, 1e-5}, Case{GemmPrecision::kTf32, 5e-3},
        Case{GemmPrecision::kBf16, 2e-2}}) {
    auto gpu = Gpu(c.p);
    for (bool ta : {false, true}) {
      for (bool tb : {false, true}) {
        auto op = [&](Backend* be, std::vector<const float*> p, float* out) {
          be->Gemm(ta, tb, m, n, k, 0.7f, p[0], p[1], 0.3f, out);
        };
        const double err = RelError(Run(gpu.get(), {a, b}, m * n, c0, op),
                                    Run(cpu_.get(), {a, b}, m * n, c0, op));
        EXPECT_LT(err, c.bound)
            << "trans " << ta << tb << " precision " << static_cast<int>(c.p);
      }
    }
  }
}

// The acceptance check: gradients of one batch agree with the CPU's, within
// 1e-4 relative (L2 over each tensor) in fp32. In bf16 they are held to the
// same arithmetic on the CPU (operands rounded to bf16, f32 accumulation)
// within 1e-3; against plain f32 only the loss is compared (3e-2), because a
// gradient summed over a batch cancels: each operand is off by up to 2^-9
// relative, but the first layer's gradients here come out 7-9 % off plain
// f32 in L2 on an H200 (and equally so on the CPU with rounded operands),
// which says nothing about the kernels.
TEST_F(CudaBackendTest, MlpGradientsAgreeWithCpu) {
  const std::vector<int> layers = {784, 256, 128, 10};
  const int batch = 128;
  std::vector<std::vector<float>> w;
  for (size_t n : Mlp(cpu_.get(), layers, batch).TensorSizes()) {
    w.push_back(Random(n, 0.05f));
  }
  std::vector<float> x(batch * 784);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  for (float& v : x) v = u(rng_);
  std::vector<int> y(batch);
  for (int i = 0; i < batch; ++i) y[i] = i % 10;
  Bf16OperandsCpu bf16_cpu;
  struct Case {
    GemmPrecision p;
    Backend* reference;
    double bound;
  };
  for (const Case& c : {Case{GemmPrecision::kFp32, cpu_.get(), 1e-4},
                        Case{GemmPrecision::kBf16, &bf16_cpu, 1e-3}}) {
    Mlp cpu_model(cpu_.get(), layers, batch);
    cpu_model.SetWeights(w);
    const double f32_loss =
        cpu_model.TrainStep(x.data(), y.data(), batch, 1.0f, false, nullptr);
    Mlp ref_model(c.reference, layers, batch);
    ref_model.SetWeights(w);
    ref_model.TrainStep(x.data(), y.data(), batch, 1.0f, false, nullptr);
    auto gpu = Gpu(c.p);
    Mlp gpu_model(gpu.get(), layers, batch);
    gpu_model.SetWeights(w);
    std::vector<int> order;
    const double gpu_loss =
        gpu_model.TrainStep(x.data(), y.data(), batch, 1.0f, false,
                            [&](int l) { order.push_back(l); });
    EXPECT_EQ(order, (std::vector<int>{2, 1, 0}));
    EXPECT_NEAR(gpu_loss, f32_loss, 3e-2 * f32_loss);
    for (size_t t = 0; t < w.size(); ++t) {
      EXPECT_LT(RelError(gpu_model.grads()[t], ref_model.grads()[t]), c.bound)
          << "tensor " << t << " precision " << static_cast<int>(c.p);
      std::printf(
          "precision %d tensor %zu: GPU vs reference %.2g, vs f32 "
          "%.2g; reference vs f32 %.2g\n",
          static_cast<int>(c.p), t,
          RelError(gpu_model.grads()[t], ref_model.grads()[t]),
          RelError(gpu_model.grads()[t], cpu_model.grads()[t]),
          RelError(ref_model.grads()[t], cpu_model.grads()[t]));
    }
  }
}

}  // namespace
}  // namespace asyncps
