// micro_bench: the server's per-byte work, each against a memory-bandwidth
// ceiling measured in the same binary (a streaming copy of 64 MiB buffers,
// bytes read + bytes written per second):
//   - each optimizer's apply on a 16M-element slice (bytes = the arrays it
//     reads and writes: SGD 12 B/element, Momentum 20, Adam 28, AdaGrad 20);
//   - payload encode and decode in f32, bf16 and f16;
//   - gradient compression (--compress) of a 4 MiB slice, the client's
//     default: Compressor::Encode (residual added, encoded, residual kept)
//     and the shard's DecodeCompressed, for bf16, top-k 1 % and one-bit;
//   - the partition of the MLP and of a 100M-parameter model.
// Each benchmark reports its bytes/s and the ceiling's (ceiling_GBps).
//
//   bazel run //tools/bench:micro_bench -- --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "common/compress.h"
#include "common/optimizer.h"
#include "common/partitioner.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

namespace asyncps {
namespace {

constexpr size_t kElements = size_t{16} << 20;  // 64 MiB of f32.

// Bytes read + written per second by memcpy of 64 MiB buffers, the best of
// a few tries.
double CopyCeiling() {
  static const double ceiling = [] {
    std::vector<char> a(kElements * 4, 1), b(kElements * 4);
    double best = 0;
    for (int i = 0; i < 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(b.data(), a.data(), a.size());
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
              .count();
      best = std::max(best, 2.0 * a.size() / s);
      a[i] = b[i + 1];
    }
    return best;
  }();
  return ceiling;
}

void Report(benchmark::State& state, double bytes_per_iteration) {
  state.SetBytesProcessed(
      static_cast<int64_t>(bytes_per_iteration * state.iterations()));
  // tools/bench/bench.sh prints bytes_per_second / ceiling_GBps.
  state.counters["ceiling_GBps"] = CopyCeiling() / 1e9;
}

void BM_CopyCeiling(benchmark::State& state) {
  std::vector<char> a(kElements * 4, 1), b(kElements * 4);
  for (auto _ : state) {
    std::memcpy(b.data(), a.data(), a.size());
    benchmark::DoNotOptimize(b.data());
  }
  Report(state, 2.0 * a.size());
}
BENCHMARK(BM_CopyCeiling)->Unit(benchmark::kMillisecond);

void BM_Apply(benchmark::State& state) {
  v1::OptimizerSpec spec;
  spec.set_kind(static_cast<v1::OptimizerSpec::Kind>(state.range(0)));
  spec.set_learning_rate(1e-3f);
  spec.set_momentum(0.9f);
  spec.set_beta1(0.9f);
  spec.set_beta2(0.999f);
  spec.set_epsilon(1e-8f);
  spec.set_initial_accumulator_value(0.1f);
  OptimizerSlots slots(spec, kElements);
  std::vector<float> g(kElements, 1e-3f), w(kElements, 0.5f);
  for (auto _ : state) {
    slots.Apply(spec, 1.0f, g, absl::MakeSpan(w));
    benchmark::DoNotOptimize(w.data());
  }
  // Arrays read (g, w, slots) and written (w, slots), 4 bytes each.
  const int slots_n = spec.kind() == v1::OptimizerSpec::ADAM  ? 2
                      : spec.kind() == v1::OptimizerSpec::SGD ? 0
                                                              : 1;
  Report(state, 4.0 * kElements * (2 + 1 + 2 * slots_n));
  state.SetLabel(v1::OptimizerSpec::Kind_Name(spec.kind()));
}
BENCHMARK(BM_Apply)
    ->Arg(v1::OptimizerSpec::SGD)
    ->Arg(v1::OptimizerSpec::MOMENTUM)
    ->Arg(v1::OptimizerSpec::ADAM)
    ->Arg(v1::OptimizerSpec::ADAGRAD)
    ->Unit(benchmark::kMillisecond);

void BM_Encode(benchmark::State& state) {
  const auto dtype = static_cast<v1::DType>(state.range(0));
  std::vector<float> values(kElements, 0.37f);
  std::string out;
  for (auto _ : state) {
    EncodeTensor(dtype, values, &out);
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, 4.0 * kElements + out.size());  // Read f32, write payload.
  state.SetLabel(v1::DType_Name(dtype));
}
BENCHMARK(BM_Encode)
    ->Arg(v1::DTYPE_F32)
    ->Arg(v1::DTYPE_BF16)
    ->Arg(v1::DTYPE_F16)
    ->Unit(benchmark::kMillisecond);

void BM_Decode(benchmark::State& state) {
  const auto dtype = static_cast<v1::DType>(state.range(0));
  std::vector<float> values(kElements, 0.37f), out(kElements);
  std::string bytes;
  EncodeTensor(dtype, values, &bytes);
  for (auto _ : state) {
    DecodeTensor(dtype, bytes, absl::MakeSpan(out));
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, bytes.size() + 4.0 * kElements);
  state.SetLabel(v1::DType_Name(dtype));
}
BENCHMARK(BM_Decode)
    ->Arg(v1::DTYPE_F32)
    ->Arg(v1::DTYPE_BF16)
    ->Arg(v1::DTYPE_F16)
    ->Unit(benchmark::kMillisecond);

// A gradient-like slice: magnitudes spread over decades, both signs.
std::vector<float> GradientLike(size_t n) {
  std::vector<float> g(n);
  uint32_t x = 12345;
  for (float& v : g) {
    x = x * 1664525u + 1013904223u;
    const float u = static_cast<float>(x >> 8) / 16777216.0f;  // [0, 1)
    v = (x & 1 ? 1.0f : -1.0f) * 1e-4f * std::exp(6.0f * u);
  }
  return g;
}

constexpr size_t kSliceElements = size_t{1} << 20;  // 4 MiB of f32.
const char* const kCodecs[] = {"bf16", "topk:0.01", "onebit"};

// Bytes: the gradient read, the residual read and written, the payload.
void BM_Compress(benchmark::State& state) {
  Compressor c(*ParseCompression(kCodecs[state.range(0)]));
  const std::vector<float> grad = GradientLike(kSliceElements);
  v1::SliceData d;
  for (auto _ : state) {
    c.Encode(0, grad, v1::DTYPE_F32, &d);
    benchmark::DoNotOptimize(d.data().data());
  }
  Report(state, 12.0 * kSliceElements + d.data().size());
  state.SetLabel(kCodecs[state.range(0)]);
}
BENCHMARK(BM_Compress)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

// Bytes: the payload read, the slice's f32 written.
void BM_Decompress(benchmark::State& state) {
  Compressor c(*ParseCompression(kCodecs[state.range(0)]));
  const std::vector<float> grad = GradientLike(kSliceElements);
  v1::SliceData d;
  c.Encode(0, grad, v1::DTYPE_F32, &d);
  std::vector<float> out(kSliceElements);
  for (auto _ : state) {
    if (d.dtype() == v1::DTYPE_BF16) {
      DecodeTensor(d.dtype(), d.data(), absl::MakeSpan(out));
    } else {
      absl::Status s =
          DecodeCompressed(d.dtype(), d.data(), absl::MakeSpan(out));
      benchmark::DoNotOptimize(s);
    }
    benchmark::DoNotOptimize(out.data());
  }
  Report(state, d.data().size() + 4.0 * kSliceElements);
  state.SetLabel(kCodecs[state.range(0)]);
}
BENCHMARK(BM_Decompress)->DenseRange(0, 2)->Unit(benchmark::kMicrosecond);

v1::ModelSpec SpecOf(const std::vector<std::vector<int64_t>>& shapes,
                     int shards) {
  v1::ModelSpec spec;
  spec.set_slice_bytes(4 << 20);
  spec.set_num_shards(shards);
  for (size_t t = 0; t < shapes.size(); ++t) {
    v1::TensorSpec* ts = spec.add_tensors();
    ts->set_name("t" + std::to_string(t));
    for (int64_t d : shapes[t]) ts->add_shape(d);
    ts->set_dtype(v1::DTYPE_F32);
  }
  return spec;
}

// No bandwidth ceiling applies: time per partition.
void BM_Partition(benchmark::State& state) {
  const v1::ModelSpec spec =
      state.range(0) == 0
          ? SpecOf({{784, 256}, {256}, {256, 128}, {128}, {128, 10}, {10}}, 2)
          : SpecOf({{10000, 10000}}, 8);
  for (auto _ : state) {
    auto p = Partition::Create(spec);
    benchmark::DoNotOptimize(p);
  }
  state.SetLabel(state.range(0) == 0 ? "MLP on 2 shards"
                                     : "100M parameters on 8 shards");
}
BENCHMARK(BM_Partition)->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace asyncps

BENCHMARK_MAIN();
