// ps_bench: how fast the servers move weights. Client threads each pull the
// whole model and push a whole-model gradient in a loop, against running
// shards, for --seconds. It prints rounds/s and payload GB/s, and the ratio to
// a ceiling measured in the same run: one thread copying the same bytes with
// memcpy (every round must at least encode and decode each payload once).
//
//   tools/bench/ps_bench.sh [--clients=2] [--model_bytes=940584]
#include <atomic>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/time/clock.h"
#include "client/embedding_client.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/large_buffers.h"
#include "common/security_flags.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:5000",
          "Every shard, shard 0 first.");
ABSL_FLAG(int, clients, 2, "Client threads, each with its own channels.");
ABSL_FLAG(int64_t, model_bytes, 940584,
          "Model size in bytes (default: the MLP 784-256-128-10).");
ABSL_FLAG(int, tensors, 6, "Tensors the model is split into.");
ABSL_FLAG(double, seconds, 5, "How long to measure.");
ABSL_FLAG(std::string, op, "pull+push",
          "What one round is: pull, push, pushpull (the fused call), "
          "pull+push (two calls), or rows (PullRows then PushRows of "
          "--row_ids distinct ids of an embedding table of --row_dim).");
ABSL_FLAG(int, row_ids, 4096, "--op=rows: distinct ids per round.");
ABSL_FLAG(int, row_dim, 32, "--op=rows: the table's row width.");
ABSL_FLAG(std::string, wire_dtype, "f32", "f32, bf16 or f16 on the wire.");
ABSL_FLAG(std::string, transport, "tcp",
          "tcp (the shards' data planes) or grpc (the gRPC service).");

namespace asyncps {
namespace {

v1::ModelSpec BenchSpec(int64_t bytes, int tensors, int shards) {
  v1::ModelSpec spec;
  spec.set_name("ps_bench");
  spec.set_seed(1);
  spec.set_slice_bytes(4 << 20);
  spec.set_num_shards(shards);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1e-6f);
  const int64_t per =
      std::max<int64_t>(1, bytes / static_cast<int64_t>(kF32Bytes) / tensors);
  for (int t = 0; t < tensors; ++t) {
    v1::TensorSpec* ts = spec.add_tensors();
    ts->set_name("t" + std::to_string(t));
    ts->add_shape(per);
    ts->set_dtype(v1::DTYPE_F32);
    ts->mutable_init()->set_kind(v1::Initializer::ZEROS);
  }
  return spec;
}

// The ceiling: bytes/s of memcpy of `bytes` on one core, for a second
// (a round encodes and decodes each payload once).
double MemcpyRate(int64_t bytes) {
  std::vector<char> a(bytes, 1), b(bytes);
  int64_t copies = 0;
  const absl::Time c0 = absl::Now();
  while (absl::Now() - c0 < absl::Seconds(1)) {
    std::memcpy(b.data(), a.data(), bytes);
    a[copies % bytes] = static_cast<char>(copies);
    ++copies;
  }
  return bytes * static_cast<double>(copies) /
         absl::ToDoubleSeconds(absl::Now() - c0);
}

// --op=rows on one client: rounds of PullRows then PushRows of the same
// --row_ids distinct random ids (hashed features: spread over every shard)
// until
// `length` has passed; false if a call failed.
bool RunRows(PsClient* client, int c, absl::Time start, absl::Duration length,
             std::atomic<int64_t>* rounds) {
  EmbeddingClient rows(client->caller());
  v1::EmbeddingSpec spec;
  spec.set_name("ps_bench_rows");
  spec.set_dim(absl::GetFlag(FLAGS_row_dim));
  spec.mutable_init()->set_kind(v1::Initializer::ZEROS);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1e-6f);
  absl::Status s = rows.Declare(spec);
  std::mt19937_64 random(static_cast<uint64_t>(c) + 1);
  const size_t n = static_cast<size_t>(absl::GetFlag(FLAGS_row_ids));
  std::vector<int64_t> ids(n);
  std::vector<float> w(n * static_cast<size_t>(spec.dim()));
  std::vector<float> g(w.size(), 1e-3f);
  // The same ids each round (a working set; repeats across clients are
  // rare), so the table does not grow without bound.
  for (int64_t& id : ids) id = static_cast<int64_t>(random() >> 1);
  while (s.ok() && absl::Now() - start < length) {
    s = rows.PullRows(spec.name(), ids, absl::MakeSpan(w));
    if (s.ok()) s = rows.PushRows(spec.name(), ids, g);
    if (s.ok()) rounds->fetch_add(1);
  }
  if (!s.ok()) std::fprintf(stderr, "%s\n", s.ToString().c_str());
  return s.ok();
}

// Every client runs `op` rounds on its own thread for --seconds from
// `start`; returns the rounds done, or -1 if a call failed.
int64_t RunClients(const std::string& op,
                   const std::vector<std::unique_ptr<PsClient>>& conns,
                   const std::vector<int>& tensors,
                   const std::vector<size_t>& sizes, absl::Time start) {
  std::atomic<int64_t> rounds{0};
  std::atomic<bool> failed{false};
  const absl::Duration length = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::thread> threads;
  for (int c = 0; c < static_cast<int>(conns.size()); ++c) {
    if (op == "rows") {
      threads.emplace_back([&, c] {
        if (!RunRows(conns[c].get(), c, start, length, &rounds)) {
          failed = true;
        }
      });
      continue;
    }
    threads.emplace_back([&, c] {
      std::vector<std::vector<float>> w, g;
      for (size_t n : sizes) {
        w.emplace_back(n, 0.0f);
        g.emplace_back(n, 1e-3f);
      }
      std::vector<SliceVersion> versions;
      absl::Status s = conns[c]->Pull(tensors, &w, &versions, c, 0);
      while (s.ok() && absl::Now() - start < length) {
        if (op == "pull" || op == "pull+push") {
          s = conns[c]->Pull(tensors, &w, &versions, c, 0);
        }
        if (s.ok() && (op == "push" || op == "pull+push")) {
          s = conns[c]->Push(tensors, g, versions, c, 0, nullptr);
        }
        if (s.ok() && op == "pushpull") {
          s = conns[c]->PushPull(tensors, g, versions, c, 0, &w, &versions,
                                 nullptr);
        }
        if (!s.ok()) {
          std::fprintf(stderr, "%s\n", s.ToString().c_str());
          failed = true;
          return;
        }
        rounds.fetch_add(1);
      }
    });
  }
  for (auto& t : threads) t.join();
  return failed ? -1 : rounds.load();
}

int Run() {
  auto servers = ParseServerList(absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) {
    std::fprintf(stderr, "%s\n", servers.status().ToString().c_str());
    return 2;
  }
  const v1::ModelSpec spec =
      BenchSpec(absl::GetFlag(FLAGS_model_bytes), absl::GetFlag(FLAGS_tensors),
                static_cast<int>(servers->size()));
  const std::string op = absl::GetFlag(FLAGS_op);
  auto wire = ParseWireDtype(absl::GetFlag(FLAGS_wire_dtype));
  auto transport = ParseTransport(absl::GetFlag(FLAGS_transport));
  if (!wire.ok() || !transport.ok() ||
      (op != "pull" && op != "push" && op != "pushpull" && op != "pull+push" &&
       op != "rows")) {
    std::fprintf(stderr, "ps_bench: bad --op, --wire_dtype or --transport\n");
    return 2;
  }
  PsClientOptions options;
  options.servers = *servers;
  options.wire_dtype = *wire;
  options.transport = *transport;
  // --tls_cert, --tls_key, --tls_ca, --auth_token_file: as the workers.
  auto security = LoadSecurity(SecurityFlagsFromCommandLine());
  if (!security.ok()) {
    std::fprintf(stderr, "%s\n", security.status().ToString().c_str());
    return 2;
  }
  options.security = *std::move(security);
  const int clients = absl::GetFlag(FLAGS_clients);
  std::vector<std::unique_ptr<PsClient>> conns;
  for (int c = 0; c < clients; ++c) {
    auto client = PsClient::Create(options);
    // Client c is rank c of the job: registered, it may push.
    absl::Status s =
        client.ok() ? (*client)->Join(c, clients) : client.status();
    if (s.ok()) s = (*client)->DeclareModel(spec);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
    conns.push_back(*std::move(client));
  }
  std::vector<int> tensors(spec.tensors_size());
  std::vector<size_t> sizes;
  int64_t bytes = 0;
  for (int t = 0; t < spec.tensors_size(); ++t) {
    tensors[t] = t;
    sizes.push_back(conns[0]->partition().tensor_elements(t));
    bytes += static_cast<int64_t>(sizes.back() * kF32Bytes);
  }
  if (op == "rows") {
    // The rows' bytes one way (ids not counted), as the model's for dense.
    bytes = int64_t{absl::GetFlag(FLAGS_row_ids)} *
            absl::GetFlag(FLAGS_row_dim) * static_cast<int64_t>(kF32Bytes);
  }

  const absl::Time start = absl::Now();
  const int64_t rounds = RunClients(op, conns, tensors, sizes, start);
  if (rounds < 0) return 1;
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  // Payload bytes per round: one direction, or both.
  const double per_round =
      (op == "pull" || op == "push" ? 1.0 : 2.0) * static_cast<double>(bytes);
  const double moved = per_round * rounds;
  const double copy_rate = MemcpyRate(bytes);
  std::printf(
      "ps_bench op=%s wire=%s transport=%s%s clients=%d shards=%zu "
      "bytes=%lld rounds_per_s=%.1f gb_per_s=%.3f\n",
      op.c_str(), absl::GetFlag(FLAGS_wire_dtype).c_str(),
      absl::GetFlag(FLAGS_transport).c_str(),
      options.security.tls() ? "+tls" : "", clients, servers->size(),
      static_cast<long long>(bytes), rounds / secs, moved / secs / 1e9);
  std::printf(
      "ceiling: memcpy of the same bytes %.2f GB/s on one core; ratio %.4f\n",
      copy_rate / 1e9, moved / secs / copy_rate);
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  asyncps::KeepLargeBuffers();
  return asyncps::Run();
}
