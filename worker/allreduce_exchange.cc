#include "worker/allreduce_exchange.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "gloo/allreduce.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/prefix_store.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace asyncps {
namespace {

// Gloo's rendezvous store, kept on shard 0 through our gRPC service. Gloo
// reports failures by exception, so this adapter throws its own.
class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(PsClient* client, absl::Duration timeout)
      : client_(client), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    absl::Status s =
        client_->StoreSet(key, std::string(data.begin(), data.end()));
    if (!s.ok()) throw gloo::IoException(s.ToString());
  }

  std::vector<char> get(const std::string& key) override {
    auto v = client_->StoreGet(key, timeout_);
    if (!v.ok()) throw gloo::IoException(v.status().ToString());
    return std::vector<char>(v->begin(), v->end());
  }

  void wait(const std::vector<std::string>& keys) override {
    wait(keys, absl::ToChronoMilliseconds(timeout_));
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    for (const std::string& key : keys) {
      auto v = client_->StoreGet(key, absl::FromChrono(timeout));
      if (!v.ok()) throw gloo::IoException(v.status().ToString());
    }
  }

 private:
  PsClient* const client_;
  const absl::Duration timeout_;
};

}  // namespace

AllreduceExchange::AllreduceExchange(
    PsClient* client, AllreduceConfig config,
    std::vector<std::vector<int>> layer_tensors)
    : client_(client),
      config_(std::move(config)),
      layer_tensors_(std::move(layer_tensors)) {
  for (const auto& l : layer_tensors_) {
    all_tensors_.insert(all_tensors_.end(), l.begin(), l.end());
  }
  std::sort(all_tensors_.begin(), all_tensors_.end());
}

AllreduceExchange::~AllreduceExchange() = default;

absl::Status AllreduceExchange::Start(std::vector<std::vector<float>>* weights,
                                      int64_t clock) {
  weights_ = weights;
  std::vector<int64_t> versions;
  absl::Status s =
      client_->Pull(all_tensors_, weights, &versions, config_.rank, clock);
  if (!s.ok()) return s;
  const v1::OptimizerSpec& opt = client_->spec().optimizer();
  for (const auto& w : *weights) {
    slots_.emplace_back(opt, w.size());
    sums_.emplace_back(w.size());
  }
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = config_.host;
    auto device = gloo::transport::tcp::CreateDevice(attr);
    GrpcStore store(client_, config_.timeout);
    // Keys of an earlier incarnation of the job must not be read again.
    gloo::rendezvous::PrefixStore prefixed(
        absl::StrCat("allreduce/", clock, "/", config_.attempt, "/"), store);
    auto context = std::make_shared<gloo::rendezvous::Context>(
        config_.rank, config_.num_workers);
    context->setTimeout(absl::ToChronoMilliseconds(config_.timeout));
    context->connectFullMesh(prefixed, device);
    context_ = std::move(context);
  } catch (const std::exception& e) {
    return Explain(absl::StrCat("joining the all-reduce ring: ", e.what()),
                   clock);
  }
  return absl::OkStatus();
}

absl::Status AllreduceExchange::AllreduceSum(std::vector<float>* data,
                                             uint32_t tag) {
  if (config_.num_workers == 1 || data->empty()) return absl::OkStatus();
  try {
    gloo::AllreduceOptions opts(context_);
    opts.setInputs(std::vector<float*>{data->data()}, data->size());
    opts.setOutputs(std::vector<float*>{data->data()}, data->size());
    opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
    opts.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(
            &gloo::sum<float>));
    opts.setTag(tag);
    opts.setTimeout(absl::ToChronoMilliseconds(config_.timeout));
    gloo::allreduce(opts);
  } catch (const std::exception& e) {
    return absl::UnavailableError(e.what());
  }
  return absl::OkStatus();
}

void AllreduceExchange::LayerReady(int layer,
                                   const std::vector<std::vector<float>>& grads,
                                   int64_t clock) {
  for (int t : layer_tensors_[layer]) {
    sums_[t] = grads[t];
    queue_.Enqueue([this, t] {
      return AllreduceSum(&sums_[t], static_cast<uint32_t>(t));
    });
  }
}

absl::Status AllreduceExchange::FinishStep(
    int64_t clock, std::vector<std::vector<float>>* weights, StepStats* stats) {
  absl::Status s = queue_.Drain();
  if (!s.ok()) {
    return Explain(
        absl::StrCat("all-reduce of step ", clock, ": ", s.message()), clock);
  }
  // The same arithmetic as a bsp server: sum, times 1/n, then the optimizer.
  const float inv = 1.0f / static_cast<float>(config_.num_workers);
  const v1::OptimizerSpec& opt = client_->spec().optimizer();
  for (size_t t = 0; t < sums_.size(); ++t) {
    for (float& g : sums_[t]) g *= inv;
    slots_[t].Apply(opt, 1.0f, sums_[t], absl::MakeSpan((*weights)[t]));
  }
  if (stats != nullptr) *stats = StepStats();
  if (config_.assign_every > 0 && clock % config_.assign_every == 0) {
    return Flush(clock);
  }
  return absl::OkStatus();
}

absl::Status AllreduceExchange::Flush(int64_t clock) {
  if (config_.rank != 0 || weights_ == nullptr) return absl::OkStatus();
  return client_->Assign(all_tensors_, *weights_, clock, config_.rank);
}

absl::Status AllreduceExchange::Explain(const std::string& what,
                                        int64_t clock) {
  // A peer that died shows up in the servers' membership once
  // --worker_timeout has passed; look for it for a little longer than that.
  std::vector<int> dead;
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  while (dead.empty() && absl::Now() < give_up) {
    auto stats = client_->Stats(0);
    if (!stats.ok()) break;
    for (const auto& w : stats->workers()) {
      if (!w.live() && w.rank() != config_.rank &&
          w.rank() < config_.num_workers) {
        dead.push_back(w.rank());
      }
    }
    if (dead.empty()) absl::SleepFor(absl::Milliseconds(250));
  }
  return absl::UnavailableError(absl::StrCat(
      "rank ", config_.rank, " at step ", clock, ": ", what, "; ",
      dead.empty() ? "no rank is known dead"
                   : absl::StrCat("rank ", absl::StrJoin(dead, ", "),
                                  " stopped answering")));
}

}  // namespace asyncps
