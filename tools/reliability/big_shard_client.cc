// big_shard_client: the worker side of tools/reliability/big_shard_check.py.
// Declares (again: the same spec is a no-op) one shard's model of
// --model_bytes of f32 weights with Adam (so the shard holds three times
// that), pushes --pushes gradients through every tensor, then pulls every
// weight and prints its SHA-256, a tensor at a time (the client never holds
// the whole model). With --probe_until it instead pushes to a tiny tensor
// of its own ("probe", left out of the hash), pull and push, until that
// file exists, and prints the pushes' latencies: what a worker sees while
// a backup joins the shard.
#include <openssl/evp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/tensor_bytes.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:5000", "The shard (one group).");
ABSL_FLAG(int64_t, model_bytes, int64_t{1100} << 20, "Weights, in bytes.");
ABSL_FLAG(int, tensors, 32, "Tensors the weights are split into.");
ABSL_FLAG(int, pushes, 0, "Gradients pushed to each tensor before the pull.");
ABSL_FLAG(int, first_push, 0, "The first push's number (its gradient).");
ABSL_FLAG(std::string, probe_until, "",
          "Push to the probe tensor until this file exists, and print the "
          "latencies.");

namespace asyncps {
namespace {

v1::ModelSpec Spec() {
  v1::ModelSpec spec;
  spec.set_name("big_shard");
  spec.set_seed(7);
  spec.set_slice_bytes(int64_t{64} << 20);
  spec.set_num_shards(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(1e-3f);
  spec.mutable_optimizer()->set_beta1(0.9f);
  spec.mutable_optimizer()->set_beta2(0.999f);
  spec.mutable_optimizer()->set_epsilon(1e-8f);
  const int tensors = absl::GetFlag(FLAGS_tensors);
  const int64_t per = absl::GetFlag(FLAGS_model_bytes) / 4 / tensors;
  for (int t = 0; t < tensors; ++t) {
    v1::TensorSpec* ts = spec.add_tensors();
    ts->set_name("t" + std::to_string(t));
    ts->add_shape(per);
    ts->set_dtype(v1::DTYPE_F32);
    ts->mutable_init()->set_kind(v1::Initializer::NORMAL);
    ts->mutable_init()->set_stddev(0.02f);
  }
  v1::TensorSpec* probe = spec.add_tensors();
  probe->set_name("probe");
  probe->add_shape(1024);
  probe->set_dtype(v1::DTYPE_F32);
  probe->mutable_init()->set_kind(v1::Initializer::ZEROS);
  return spec;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "big_shard_client: %s\n", s.ToString().c_str());
  return 1;
}

// The probe: pull and push the probe tensor until `until` exists; prints
// how many, and the latencies' median, 99th percentile and maximum.
int Probe(PsClient& ps, const v1::ModelSpec& spec, const std::string& until) {
  const int t = spec.tensors_size() - 1;
  const int tensor[] = {t};
  std::vector<double> ms;
  std::vector<std::pair<double, double>> slowest;  // (ms, seconds in)
  const absl::Time begin = absl::Now();
  std::printf("probing\n");  // The caller starts what it measures now.
  std::fflush(stdout);
  while (access(until.c_str(), F_OK) != 0) {
    const absl::Time start = absl::Now();
    std::vector<std::vector<float>> w(spec.tensors_size());
    w[t].resize(ps.partition().tensor_elements(t));
    std::vector<SliceVersion> versions;
    absl::Status s = ps.Pull(tensor, &w, &versions, 0, 0);
    std::vector<std::vector<float>> g(spec.tensors_size());
    g[t].assign(w[t].size(), 1e-3f);
    if (s.ok()) s = ps.Push(tensor, g, versions, 0, 0, nullptr);
    if (!s.ok()) return Fail(s);
    ms.push_back(absl::ToDoubleMilliseconds(absl::Now() - start));
    slowest.emplace_back(ms.back(), absl::ToDoubleSeconds(start - begin));
    std::sort(slowest.rbegin(), slowest.rend());
    if (slowest.size() > 5) slowest.pop_back();
  }
  if (ms.empty()) return Fail(absl::FailedPreconditionError("no probe push"));
  std::vector<double> sorted = ms;
  std::sort(sorted.begin(), sorted.end());
  auto at = [&](double q) {
    return sorted[std::min(sorted.size() - 1,
                           static_cast<size_t>(q * sorted.size()))];
  };
  std::printf("probe %zu pull+push p50 %.2f ms p99 %.2f ms max %.2f ms\n",
              sorted.size(), at(0.5), at(0.99), sorted.back());
  std::printf("probe slowest:");
  for (const auto& [took, when] : slowest) {
    std::printf(" %.1f ms at %.1f s", took, when);
  }
  std::printf("\n");
  return 0;
}

int Run() {
  auto servers = ParseServerList(absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) return Fail(servers.status());
  PsClientOptions options;
  options.servers = *servers;
  options.rpc_timeout = absl::Minutes(5);
  auto client = PsClient::Create(options);
  if (!client.ok()) return Fail(client.status());
  PsClient& ps = **client;
  const v1::ModelSpec spec = Spec();
  absl::Status s = ps.Join(0, 1);
  const absl::Time start = absl::Now();
  if (s.ok()) s = ps.DeclareModel(spec);
  if (!s.ok()) return Fail(s);
  if (!absl::GetFlag(FLAGS_probe_until).empty()) {
    return Probe(ps, spec, absl::GetFlag(FLAGS_probe_until));
  }
  if (absl::GetFlag(FLAGS_pushes) > 0) {
    std::printf("declared %lld bytes of weights in %.1f s\n",
                static_cast<long long>(absl::GetFlag(FLAGS_model_bytes)),
                absl::ToDoubleSeconds(absl::Now() - start));
    const absl::Time pushing = absl::Now();
    const int first = absl::GetFlag(FLAGS_first_push);
    for (int p = first; p < first + absl::GetFlag(FLAGS_pushes); ++p) {
      for (int t = 0; t < spec.tensors_size(); ++t) {
        // Indexed by tensor; only t's is filled.
        std::vector<std::vector<float>> w(spec.tensors_size());
        w[t].resize(ps.partition().tensor_elements(t));
        std::vector<SliceVersion> versions;
        const int tensor[] = {t};
        s = ps.Pull(tensor, &w, &versions, 0, 0);
        if (!s.ok()) return Fail(s);
        // A gradient that differs per element, push and tensor.
        std::vector<std::vector<float>> g(spec.tensors_size());
        g[t].resize(w[t].size());
        for (size_t i = 0; i < g[t].size(); ++i) {
          g[t][i] = std::sin(0.001f * static_cast<float>(i) + p + t) * 1e-2f;
        }
        s = ps.Push(tensor, g, versions, 0, 0, nullptr);
        if (!s.ok()) return Fail(s);
      }
    }
    std::printf("pushed %d x %lld bytes in %.1f s\n",
                absl::GetFlag(FLAGS_pushes),
                static_cast<long long>(absl::GetFlag(FLAGS_model_bytes)),
                absl::ToDoubleSeconds(absl::Now() - pushing));
  }
  const absl::Time pulling = absl::Now();
  EVP_MD_CTX* sha = EVP_MD_CTX_new();
  EVP_DigestInit_ex(sha, EVP_sha256(), nullptr);
  int64_t bytes = 0;
  for (int t = 0; t + 1 < spec.tensors_size(); ++t) {  // Not the probe.
    std::vector<std::vector<float>> w(spec.tensors_size());
    w[t].resize(ps.partition().tensor_elements(t));
    std::vector<SliceVersion> versions;
    const int tensor[] = {t};
    s = ps.Pull(tensor, &w, &versions, 0, 0);
    if (!s.ok()) return Fail(s);
    std::string le;
    EncodeF32(w[t], &le);
    EVP_DigestUpdate(sha, le.data(), le.size());
    bytes += static_cast<int64_t>(le.size());
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int digest_bytes = 0;
  EVP_DigestFinal_ex(sha, digest, &digest_bytes);
  EVP_MD_CTX_free(sha);
  std::string hex;
  for (unsigned int i = 0; i < digest_bytes; ++i) {
    const unsigned char c = digest[i];
    static const char kHex[] = "0123456789abcdef";
    hex += kHex[c >> 4];
    hex += kHex[c & 15];
  }
  std::printf("pulled %lld bytes in %.1f s\nsha256 %s\n",
              static_cast<long long>(bytes),
              absl::ToDoubleSeconds(absl::Now() - pulling), hex.c_str());
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return asyncps::Run();
}
