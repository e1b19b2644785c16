// gpu_bench: one worker's speed on its compute backend, for a GPU (and, for
// comparison, the CPU). For each MLP it prints
//   - samples/s of forward+backward alone (no servers);
//   - the step's GEMM TFLOP/s, and the ceiling: a bare GEMM of each of the
//     step's shapes on the same backend, timed in the same run; the ratio
//     says how close the model's GEMMs come to the library's best;
//   - with --servers, samples/s of real async steps through the parameter
//     servers and the share of step time spent waiting on them.
//
//   bazel run --config=cuda //tools/bench:gpu_bench -- --device=cuda:0
//   tools/bench/gpu_bench.sh      # starts local servers, runs both models
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "asyncps/client.h"
#include "common/cluster_spec.h"
#include "worker/device.h"
#include "worker/model/mlp.h"
#include "worker/ps_exchange.h"

ABSL_FLAG(std::string, device, "auto", "auto, cpu or cuda:N.");
ABSL_FLAG(std::string, precision, "fp32", "fp32, tf32 or bf16.");
ABSL_FLAG(std::string, models, "784,256,128,10;4096,4096,4096,10",
          "Semicolon-separated MLP layer lists.");
ABSL_FLAG(int, batch_size, 512, "Examples per step.");
ABSL_FLAG(int, steps, 50, "Timed steps per measurement (after 5 warm-up).");
ABSL_FLAG(std::string, servers, "",
          "If set, also time async steps through these shards.");
ABSL_FLAG(int, blas_threads, 0, "OpenBLAS threads for the CPU (0: default).");
ABSL_FLAG(std::string, compress, "none",
          "Gradients to the servers: none, bf16, f16, topk:RATIO or onebit "
          "(docs/COMPRESSION.md).");
ABSL_FLAG(std::string, wire_dtype, "f32",
          "Tensors on the wire: f32, bf16 or f16 (docs/MODES.md).");

namespace asyncps {
namespace {

struct GemmShape {
  bool ta, tb;
  int m, n, k;
};

// The GEMMs of one MLP training step, as Mlp::TrainStep issues them.
std::vector<GemmShape> StepGemms(const std::vector<int>& layers, int batch) {
  std::vector<GemmShape> g;
  const int L = static_cast<int>(layers.size()) - 1;
  for (int l = 0; l < L; ++l)
    g.push_back({false, false, batch, layers[l + 1], layers[l]});
  for (int l = L - 1; l >= 0; --l) {
    g.push_back({true, false, layers[l], layers[l + 1], batch});
    if (l > 0) g.push_back({false, true, batch, layers[l], layers[l + 1]});
  }
  return g;
}

double Flops(const GemmShape& s) { return 2.0 * s.m * s.n * s.k; }

// Seconds per call of a bare GEMM of this shape on `b`.
double TimeGemm(Backend* b, const GemmShape& s, int reps) {
  DeviceArray<float> a(b, static_cast<size_t>(s.m) * s.k);
  DeviceArray<float> bb(b, static_cast<size_t>(s.k) * s.n);
  DeviceArray<float> c(b, static_cast<size_t>(s.m) * s.n);
  for (int i = 0; i < 3; ++i) {
    b->Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), bb.data(), 0.0f,
            c.data());
  }
  b->Synchronize();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < reps; ++i) {
    b->Gemm(s.ta, s.tb, s.m, s.n, s.k, 1.0f, a.data(), bb.data(), 0.0f,
            c.data());
  }
  b->Synchronize();
  return absl::ToDoubleSeconds(absl::Now() - t0) / reps;
}

// Seconds per step of the step's copies alone: every tensor's weights up
// from pageable host memory and its gradient back down, through the backend
// as Mlp::SetWeights and Mlp::TrainStep do them.
double TimeCopies(Backend* b, const std::vector<size_t>& sizes, int reps) {
  std::vector<std::vector<float>> host;
  std::vector<DeviceArray<float>> dev;
  for (size_t n : sizes) {
    host.emplace_back(n, 0.5f);
    dev.emplace_back(b, n);
  }
  auto once = [&] {
    for (size_t t = 0; t < sizes.size(); ++t) dev[t].Upload(host[t]);
    std::vector<int64_t> tickets;
    for (size_t t = 0; t < sizes.size(); ++t) {
      tickets.push_back(b->DownloadAsync(dev[t].data(), host[t].data(),
                                         sizes[t] * sizeof(float)));
    }
    for (int64_t ticket : tickets) b->WaitDownload(ticket);
  };
  once();
  b->Synchronize();
  const absl::Time t0 = absl::Now();
  for (int i = 0; i < reps; ++i) once();
  b->Synchronize();
  return absl::ToDoubleSeconds(absl::Now() - t0) / reps;
}

// The same model's steps through the servers (--servers), as ps_worker
// trains through the public client library; prints the share of the step
// spent waiting on them. 0, or the exit status of a failure.
int ThroughServers(const std::vector<int>& layers, int batch, int steps,
                   Mlp* model, std::vector<std::vector<float>>* weights,
                   const std::vector<float>& x, const std::vector<int>& y) {
  std::vector<std::vector<float>>& w = *weights;
  auto servers = ParseServerList(absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) {
    std::fprintf(stderr, "%s\n", servers.status().ToString().c_str());
    return 2;
  }
  // Through the public client library, as ps_worker trains.
  ClientOptions options;
  options.servers =
      absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  options.rank = 0;
  options.slice_bytes = 4 << 20;
  options.compress = absl::GetFlag(FLAGS_compress);
  options.wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  auto client = Client::Connect(options);
  absl::Status s = client.status();
  if (s.ok()) {
    std::vector<TensorSpec> tensors;
    for (size_t l = 0; l + 1 < layers.size(); ++l) {
      tensors.push_back(
          {absl::StrCat("layer", l, "/w"), {(layers)[l], (layers)[l + 1]}});
      tensors.push_back({absl::StrCat("layer", l, "/b"), {(layers)[l + 1]}});
    }
    OptimizerOptions sgd;
    sgd.kind = "sgd";
    sgd.learning_rate = 1e-4f;
    s = (*client)->Declare(tensors, {w.begin(), w.end()}, sgd);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  PsExchange exchange(client->get(), model->LayerTensors());
  s = exchange.Start(&w, 0);
  double wait_s = 0;
  const absl::Time t1 = absl::Now();
  for (int i = 0; i < steps && s.ok(); ++i) {
    model->SetWeights(w);
    model->TrainStep(x.data(), y.data(), batch, 1.0f, false, [&](int l) {
      exchange.LayerReady(l, model->grads(), i + 1);
    });
    const absl::Time w0 = absl::Now();
    s = exchange.FinishStep(i + 1, &w, nullptr);
    wait_s += absl::ToDoubleSeconds(absl::Now() - w0);
  }
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  const double total = absl::ToDoubleSeconds(absl::Now() - t1);
  std::printf(
      "  through %zu shards (compress %s, wire %s): %.0f samples/s, %.3f "
      "ms/step, %.0f%% of the step waiting on the servers\n",
      servers->size(), options.compress.c_str(), options.wire_dtype.c_str(),
      batch * steps / total, total / steps * 1e3, 100 * wait_s / total);
  return 0;
}

int Run() {
  auto precision = ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) {
    std::fprintf(stderr, "%s\n", precision.status().ToString().c_str());
    return 2;
  }
  auto backend = MakeBackend(absl::GetFlag(FLAGS_device), *precision, 0,
                             absl::GetFlag(FLAGS_blas_threads));
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", backend.status().ToString().c_str());
    return 2;
  }
  Backend* b = backend->get();
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int steps = absl::GetFlag(FLAGS_steps);
  std::printf("gpu_bench on %s, batch %d, %d steps\n", b->Name().c_str(), batch,
              steps);
  for (absl::string_view text :
       absl::StrSplit(absl::GetFlag(FLAGS_models), ';')) {
    auto layers = ParseLayers(text);
    if (!layers.ok()) {
      std::fprintf(stderr, "%s\n", layers.status().ToString().c_str());
      return 2;
    }
    Mlp model(b, *layers, batch);
    std::vector<std::vector<float>> w;
    for (size_t n : model.TensorSizes()) w.emplace_back(n, 0.001f);
    model.SetWeights(w);
    std::vector<float> x(static_cast<size_t>(batch) * layers->front(), 0.5f);
    std::vector<int> y(batch);
    for (int i = 0; i < batch; ++i) y[i] = i % layers->back();
    for (int i = 0; i < 5; ++i) {
      model.TrainStep(x.data(), y.data(), batch, 1.0f, false, nullptr);
    }
    b->Synchronize();
    const absl::Time t0 = absl::Now();
    for (int i = 0; i < steps; ++i) {
      model.SetWeights(w);  // A real step uploads fresh weights too.
      model.TrainStep(x.data(), y.data(), batch, 1.0f, false, nullptr);
    }
    b->Synchronize();
    const double step_s = absl::ToDoubleSeconds(absl::Now() - t0) / steps;

    double flops = 0, ceiling_s = 0;
    for (const GemmShape& s : StepGemms(*layers, batch)) {
      flops += Flops(s);
      ceiling_s += TimeGemm(b, s, steps);
    }
    std::printf("model %.*s\n", static_cast<int>(text.size()), text.data());
    std::printf("  compute only: %.0f samples/s, %.3f ms/step\n",
                batch / step_s, step_s * 1e3);
    std::printf(
        "  GEMMs: %.2f TFLOP/s in the step; bare GEMMs of the same shapes "
        "%.2f TFLOP/s; ratio %.2f\n",
        flops / step_s / 1e12, flops / ceiling_s / 1e12, ceiling_s / step_s);
    size_t bytes = 0;
    for (size_t n : model.TensorSizes()) bytes += n * sizeof(float);
    const double copies_s = TimeCopies(b, model.TensorSizes(), steps);
    std::printf(
        "  copies: weights up and gradients down alone %.3f ms/step (%.1f "
        "GB/s, both ways together); bare GEMMs + copies %.3f ms = %.2f of the "
        "step\n",
        copies_s * 1e3, 2 * bytes / copies_s / 1e9,
        (ceiling_s + copies_s) * 1e3, (ceiling_s + copies_s) / step_s);

    if (absl::GetFlag(FLAGS_servers).empty()) continue;
    if (int failed = ThroughServers(*layers, batch, steps, &model, &w, x, y)) {
      return failed;
    }
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Run();
}
