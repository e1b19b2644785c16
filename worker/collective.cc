#include "worker/collective.h"

#include <signal.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "common/wire_dtype.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#ifdef ASYNCPS_WITH_CUDA
#include "worker/cuda/nccl_collective.h"
#endif

namespace asyncps {
namespace {

// Gloo's rendezvous store over ours (on shard 0, through the servers).
// Gloo reports failures by exception, so this adapter throws its own.
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(RendezvousStore* store, absl::Duration timeout)
      : store_(store), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s =
        store_->StoreSet(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(s.ToString());
  }

  std::vector<char> get(const std::string& key) override {
    auto v = store_->StoreGet(key, timeout_);
    if (!v.ok()) throw gloo::IoException(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      auto v = store_->StoreGet(key, absl::FromChrono(timeout));
      if (!v.ok()) throw gloo::IoException(v.status().ToString());
    }
  }

 private:
  RendezvousStore* const store_;
  const absl::Duration timeout_;
};

class GlooCollective final : public Collective {
 public:
  explicit GlooCollective(std::shared_ptr<gloo::Context> context,
                          absl::Duration timeout)
      : context_(std::move(context)), timeout_(timeout) {}

  std::string Name() const override { return "gloo ring over TCP"; }

  absl::Status AllreduceSum(std::vector<float>* data, uint32_t tag) override {
    return Allreduce(data, &gloo::sum<float>, tag);
  }

  absl::Status AllreduceSumHalf(std::vector<uint16_t>* data,
                                uint32_t tag) override {
    return Allreduce(data, &SumHalves, tag);
  }

 private:
  // Gloo's ring over `data` in place, elements combined by `reduce`.
  template <typename T>
  absl::Status Allreduce(std::vector<T>* data,
                         void (*reduce)(void*, const void*, const void*,
                                        size_t),
                         uint32_t tag) {
    if (context_->size == 1 || data->empty()) return absl::OkStatus();
    try {
      gloo::AllreduceOptions opts(context_);
      opts.setInputs(std::vector<T*>{data->data()}, data->size());
      opts.setOutputs(std::vector<T*>{data->data()}, data->size());
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(reduce);
      opts.setTag(tag);
      opts.setTimeout(absl::ToChronoMilliseconds(timeout_));
      gloo::allreduce(opts);
    } catch (const std::exception& e) {
      return absl::UnavailableError(e.what());
    }
    return absl::OkStatus();
  }

  // c = a + b over n IEEE halves, each sum rounded to half; a chunk at a
  // time through the vectorized conversions (common/wire_dtype.h).
  static void SumHalves(void* c, const void* a, const void* b, size_t n) {
    constexpr size_t kChunk = 2048;
    float x[kChunk], y[kChunk];
    std::string sum;
    const auto* pa = static_cast<const char*>(a);
    const auto* pb = static_cast<const char*>(b);
    auto* pc = static_cast<char*>(c);
    for (size_t i = 0; i < n; i += kChunk) {
      const size_t m = std::min(kChunk, n - i);
      DecodeTensor(v1::DTYPE_F16, absl::string_view(pa + 2 * i, 2 * m),
                   absl::MakeSpan(x, m));
      DecodeTensor(v1::DTYPE_F16, absl::string_view(pb + 2 * i, 2 * m),
                   absl::MakeSpan(y, m));
      for (size_t k = 0; k < m; ++k) x[k] += y[k];
      EncodeTensor(v1::DTYPE_F16, absl::MakeConstSpan(x, m), &sum);
      std::memcpy(pc + 2 * i, sum.data(), 2 * m);
    }
  }

  const std::shared_ptr<gloo::Context> context_;
  const absl::Duration timeout_;
};

// Gloo's TCP pairs write without MSG_NOSIGNAL: a peer that dies while this
// process writes to it raises SIGPIPE, whose default action kills this
// process, a survivor that would have re-formed the ring (found by
// tools/bench/elastic_allreduce_chaos.py: rank 0 ended by signal 13 in one
// seed of 12). So a process that joins a Gloo ring ignores SIGPIPE, unless
// it has a handler of its own; the write then fails with EPIPE, which
// fails the operation.
void IgnoreSigpipe() {
  struct sigaction now;
  if (sigaction(SIGPIPE, nullptr, &now) == 0 && now.sa_handler == SIG_DFL) {
    std::signal(SIGPIPE, SIG_IGN);
  }
}

absl::StatusOr<std::unique_ptr<Collective>> JoinGloo(
    const CollectiveConfig& config, RendezvousStore* store) {
  IgnoreSigpipe();
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = config.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    const absl::Duration join_timeout =
        config.join_timeout > absl::ZeroDuration() ? config.join_timeout
                                                   : config.timeout;
    GlooStore gloo_store(store, join_timeout);
    gloo::rendezvous::PrefixStore prefixed(config.prefix, gloo_store);
    auto context = std::make_shared<gloo::rendezvous::Context>(
        config.rank, config.num_workers);
    // Gloo waits five times this for a peer to connect (a peer whose address
    // was left by a process that died never does); each operation sets its
    // own (GlooCollective).
    context->setTimeout(absl::ToChronoMilliseconds(join_timeout / 5));
    context->connectFullMesh(prefixed, device);
    return std::unique_ptr<Collective>(
        new GlooCollective(std::move(context), config.timeout));
  } catch (const std::exception& e) {
    return absl::UnavailableError(e.what());
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> JoinCollective(
    const CollectiveConfig& config, RendezvousStore* store) {
  if (config.kind == "gloo") return JoinGloo(config, store);
  if (config.kind == "nccl") {
#ifdef ASYNCPS_WITH_CUDA
    return JoinNccl(config, store);
#else
    return absl::FailedPreconditionError(
        "--collective=nccl needs a build with --config=cuda");
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("--collective=", config.kind, " (want auto, gloo or nccl)"));
}

}  // namespace asyncps
