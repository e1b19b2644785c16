#include "worker/allreduce_exchange.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace asyncps {

AllreduceExchange::AllreduceExchange(
    PsClient* client, AllreduceConfig config,
    std::vector<std::vector<int>> layer_tensors)
    : client_(client),
      store_(client->caller()),
      config_(std::move(config)),
      layer_tensors_(std::move(layer_tensors)),
      all_tensors_(AllTensors(layer_tensors_)) {}

absl::Status AllreduceExchange::Start(std::vector<std::vector<float>>* weights,
                                      int64_t clock) {
  weights_ = weights;
  std::vector<SliceVersion> versions;
  absl::Status s =
      client_->Pull(all_tensors_, weights, &versions, config_.rank, clock);
  if (!s.ok()) return s;
  const v1::OptimizerSpec& opt = client_->spec().optimizer();
  for (const auto& w : *weights) {
    slots_.emplace_back(opt, w.size());
    sums_.emplace_back(w.size());
    halves_.emplace_back();
  }
  CollectiveConfig cc;
  cc.kind = config_.collective;
  cc.rank = config_.rank;
  cc.num_workers = config_.num_workers;
  cc.host = config_.host;
  cc.cuda_device = config_.cuda_device;
  cc.timeout = config_.timeout;
  // Keys of an earlier attempt of the job must not be read again.
  cc.prefix = absl::StrCat("allreduce/", clock, "/", config_.attempt, "/");
  auto joined = JoinCollective(cc, &store_);
  if (!joined.ok()) {
    if (joined.status().code() != absl::StatusCode::kUnavailable) {
      return joined.status();
    }
    return Explain(
        absl::StrCat("joining the all-reduce: ", joined.status().message()),
        clock);
  }
  collective_ = *std::move(joined);
  return absl::OkStatus();
}

void AllreduceExchange::LayerReady(int layer,
                                   const std::vector<std::vector<float>>& grads,
                                   int64_t clock) {
  if (config_.num_workers == 1) {
    // Nothing to reduce: FinishStep applies the model's own gradients.
    alone_grads_ = &grads;
    return;
  }
  for (int t : layer_tensors_[layer]) {
    if (config_.f16) {
      std::vector<uint16_t>& h = halves_[t];
      h.resize(grads[t].size());
      EncodeTensor(v1::DTYPE_F16, grads[t], &staged_);  // Vectorized.
      if (!h.empty()) std::memcpy(h.data(), staged_.data(), staged_.size());
      queue_.Enqueue([this, t] {
        return collective_->AllreduceSumHalf(&halves_[t],
                                             static_cast<uint32_t>(t));
      });
      continue;
    }
    sums_[t] = grads[t];
    queue_.Enqueue([this, t] {
      return collective_->AllreduceSum(&sums_[t], static_cast<uint32_t>(t));
    });
  }
}

absl::Status AllreduceExchange::FinishStep(
    int64_t clock, std::vector<std::vector<float>>* weights, StepStats* stats) {
  absl::Status s = queue_.Drain();
  if (!s.ok()) return Reform(clock, s, stats);
  if (config_.f16 && alone_grads_ == nullptr) {
    // Back to f32, checked whole before any weight moves.
    for (size_t t = 0; t < sums_.size(); ++t) {
      DecodeTensor(
          v1::DTYPE_F16,
          absl::string_view(reinterpret_cast<const char*>(halves_[t].data()),
                            halves_[t].size() * sizeof(uint16_t)),
          absl::MakeSpan(sums_[t]));
      const int64_t bad = FirstNonFinite(sums_[t]);
      if (bad >= 0) {
        return absl::OutOfRangeError(absl::StrCat(
            "step ", clock, ": the f16 all-reduce of tensor ", t,
            " overflowed at element ", bad,
            " (--compress=f16 sums in half precision; scale the loss down "
            "or train without it); no weight was changed"));
      }
    }
  }
  // The same arithmetic as a bsp server: sum, times 1/n, then the optimizer.
  const float inv = 1.0f / static_cast<float>(config_.num_workers);
  const v1::OptimizerSpec& opt = client_->spec().optimizer();
  for (size_t t = 0; t < sums_.size(); ++t) {
    if (alone_grads_ != nullptr) {
      slots_[t].Apply(opt, 1.0f, (*alone_grads_)[t],
                      absl::MakeSpan((*weights)[t]));
      continue;
    }
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
  absl::Status s =
      client_->Assign(all_tensors_, *weights_, clock, config_.rank);
  if (s.code() != absl::StatusCode::kFailedPrecondition) return s;
  // A shard restarted without a checkpoint: declare the model on it again
  // (idempotent elsewhere); these weights then replace its initial ones.
  auto lost = client_->ShardsWithoutModel();
  if (!lost.ok() || lost->empty()) return s;
  if (absl::Status d = client_->DeclareModel(client_->spec()); !d.ok()) {
    return d;
  }
  return client_->Assign(all_tensors_, *weights_, clock, config_.rank);
}

absl::Status AllreduceExchange::Reform(int64_t clock,
                                       const absl::Status& failure,
                                       StepStats* stats) {
  const std::string what =
      absl::StrCat("all-reduce of step ", clock, ": ", failure.message());
  if (!config_.rejoin || config_.num_workers == 1) return Explain(what, clock);
  LOG(WARNING) << "rank " << config_.rank << ": " << what
               << "; re-forming the ring, waiting up to "
               << absl::FormatDuration(config_.timeout)
               << " for a replacement of the dead rank";
  // Rank 0's weights are the newest the job has: hand them over first, so
  // the ring resumes from them rather than from the last periodic upload.
  if (absl::Status flushed = Flush(clock - 1); !flushed.ok()) {
    LOG(WARNING) << "handing over the weights before re-forming: " << flushed;
  }
  auto rejoined = config_.rejoin();
  if (!rejoined.ok()) return Explain(what, clock);
  const auto [resume, attempt] = *rejoined;
  config_.attempt = attempt;
  collective_.reset();
  slots_.clear();  // A replacement starts with none: so do we.
  sums_.clear();
  if (absl::Status s = Start(weights_, resume); !s.ok()) {
    return Explain(absl::StrCat(what, "; re-forming the ring: ", s.message()),
                   clock);
  }
  LOG(WARNING) << "rank " << config_.rank << ": the ring re-formed at step "
               << resume;
  if (stats != nullptr) {
    *stats = StepStats();
    stats->next_clock = resume;
  }
  return absl::OkStatus();
}

absl::Status AllreduceExchange::Explain(const std::string& what,
                                        int64_t clock) {
  // A peer that died shows up in the servers' membership once
  // --worker_timeout has passed; look for it for a little longer than that.
  std::vector<int> dead;
  const absl::Time give_up = absl::Now() + absl::Seconds(15);
  while (dead.empty() && absl::Now() < give_up) {
    auto stats = AdminClient(client_->caller()).Stats(0);
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
