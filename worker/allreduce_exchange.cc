#include "worker/allreduce_exchange.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "common/status_macros.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace asyncps {

namespace {

// Sync's message per rank: whether it holds trained state, its clock and its
// optimizer's step count, each count as two floats of 24 bits (exact).
constexpr int kSaid = 5;
// The longest one attempt at joining a ring may take; a ring's ranks have all
// asked for it before they join, so only a rank that died meanwhile (or a
// shard 0 that restarts) makes it slow, and the next attempt goes on without
// waiting out the whole collective timeout.
constexpr absl::Duration kJoinTimeout = absl::Seconds(5);

void Put(int64_t v, float* out) {
  out[0] = static_cast<float>(v >> 24);
  out[1] = static_cast<float>(v & 0xFFFFFF);
}

int64_t Get(const float* in) {
  return (static_cast<int64_t>(in[0]) << 24) + static_cast<int64_t>(in[1]);
}

CollectiveConfig CollectiveFor(const AllreduceConfig& config) {
  CollectiveConfig cc;
  cc.kind = config.collective;
  cc.rank = config.rank;
  cc.num_workers = config.num_workers;
  cc.host = config.host;
  cc.cuda_device = config.cuda_device;
  cc.timeout = config.timeout;
  cc.join_timeout = std::min(config.timeout, kJoinTimeout);
  return cc;
}

}  // namespace

AllreduceExchange::AllreduceExchange(
    PsClient* client, AllreduceConfig config,
    std::vector<std::vector<int>> layer_tensors)
    : client_(client),
      store_(client->caller()),
      config_(std::move(config)),
      ring_(&store_, CollectiveFor(config_), config_.clock),
      layer_tensors_(std::move(layer_tensors)),
      all_tensors_(AllTensors(layer_tensors_)) {
  if (config_.elastic) {
    elastic_ = std::make_unique<ElasticRing>(&store_, CollectiveFor(config_),
                                             config_.live, config_.clock);
  }
}

int AllreduceExchange::RingSize() const {
  return elastic_ != nullptr ? static_cast<int>(elastic_->members().size())
                             : config_.num_workers;
}

std::string AllreduceExchange::RingSays() const {
  if (elastic_ == nullptr) {
    return absl::StrCat("generation ", ring_.generation());
  }
  return absl::StrCat("generation ", elastic_->generation(), ", ranks ",
                      absl::StrJoin(elastic_->members(), ","));
}

int AllreduceExchange::RingIndex() const {
  return elastic_ != nullptr ? elastic_->index() : config_.rank;
}

absl::Status AllreduceExchange::Start(std::vector<std::vector<float>>* weights,
                                      int64_t clock) {
  weights_ = weights;
  std::vector<SliceVersion> versions;
  absl::Status s =
      client_->Pull(all_tensors_, weights, &versions, config_.rank, clock);
  if (s.code() == absl::StatusCode::kFailedPrecondition) {
    // A shard restarted without a checkpoint after the job trained: its
    // declaration left it to a worker holding its trained weights. Here
    // those are the ring's: a survivor hands them over as the ring forms
    // (Sync), and rank 0 to the shards after. So the model is declared
    // there again, as Flush does, and pulled as a starting point.
    auto lost = client_->ShardsWithoutModel();
    if (lost.ok() && !lost->empty()) {
      LOG(WARNING) << "rank " << config_.rank << ": shard(s) "
                   << absl::StrJoin(*lost, ",")
                   << " lost the model; declared again there, the trained "
                      "weights come from the ring";
      RETURN_IF_ERROR(client_->DeclareModel(client_->spec()));
      s = client_->Pull(all_tensors_, weights, &versions, config_.rank, clock);
    }
  }
  if (!s.ok()) return s;
  const v1::OptimizerSpec& opt = client_->spec().optimizer();
  for (const auto& w : *weights) {
    slots_.emplace_back(opt, w.size());
    sums_.emplace_back(w.size());
    halves_.emplace_back();
  }
  s = FormRing(clock, config_.clock->Now() + config_.timeout);
  if (s.ok() || (s.code() != absl::StatusCode::kUnavailable &&
                 s.code() != absl::StatusCode::kDeadlineExceeded)) {
    return s;
  }
  return Explain(absl::StrCat("joining the all-reduce: ", s.message()), clock);
}

absl::Status AllreduceExchange::FormRing(int64_t clock, absl::Time deadline) {
  while (true) {
    auto joined =
        elastic_ != nullptr ? elastic_->Join(deadline) : ring_.Join(deadline);
    if (!joined.ok()) return joined.status();
    collective_ = *std::move(joined);
    absl::Status s = Sync(clock);
    if (s.ok()) return s;
    LOG(WARNING) << "rank " << config_.rank << ": ring generation "
                 << Generation() << " broke as it formed: " << s;
    collective_.reset();
    ring_.Broke();  // Elastic: the next Join re-forms the ring anyway.
    if (config_.clock->Now() >= deadline) return s;
  }
}

absl::Status AllreduceExchange::Sync(int64_t clock) {
  const int n = RingSize();
  std::vector<float> said(kSaid * n, 0.0f);
  float* mine = &said[kSaid * RingIndex()];
  mine[0] = trained_ ? 1.0f : 0.0f;
  Put(clock, &mine[1]);
  Put(slots_.empty() ? 0 : slots_[0].steps(), &mine[3]);
  const uint32_t tag = static_cast<uint32_t>(weights_->size());
  if (absl::Status s = collective_->AllreduceSum(&said, tag); !s.ok()) {
    return s;
  }
  // The most trained state: a survivor's, then the highest clock.
  int source = 0;
  for (int r = 1; r < n; ++r) {
    const float* a = &said[kSaid * r];
    const float* b = &said[kSaid * source];
    if (std::make_pair(a[0], Get(&a[1])) > std::make_pair(b[0], Get(&b[1]))) {
      source = r;
    }
  }
  const float* from = &said[kSaid * source];
  // Every rank sends the same three buffers per tensor, in the same order,
  // into copies: a ring that breaks halfway changes nothing here.
  const size_t tensors = weights_->size();
  std::vector<std::vector<float>> got;
  got.reserve(3 * tensors);
  for (size_t t = 0; t < tensors; ++t) {
    got.push_back((*weights_)[t]);
    got.push_back(slots_[t].slot1());
    got.push_back(slots_[t].slot2());
    for (size_t k = got.size() - 3; k < got.size(); ++k) {
      if (RingIndex() != source) {
        std::fill(got[k].begin(), got[k].end(), 0.0f);
      }
      absl::Status s =
          collective_->AllreduceSum(&got[k], static_cast<uint32_t>(t));
      if (!s.ok()) return s;
    }
  }
  for (size_t t = 0; t < tensors; ++t) {
    (*weights_)[t] = std::move(got[3 * t]);
    slots_[t].Restore(std::move(got[3 * t + 1]), std::move(got[3 * t + 2]),
                      Get(&from[3]));
  }
  resumed_clock_ = Get(&from[1]);
  if (source != RingIndex() || resumed_clock_ != clock) {
    LOG(INFO) << "rank " << config_.rank << ": ring generation " << Generation()
              << " goes on from rank "
              << (elastic_ != nullptr ? elastic_->members()[source] : source)
              << "'s step " << resumed_clock_ << " (this rank was at " << clock
              << ")";
  }
  trained_ = true;
  return absl::OkStatus();
}

void AllreduceExchange::LayerReady(int layer,
                                   const std::vector<std::vector<float>>& grads,
                                   int64_t clock) {
  if (RingSize() == 1) {
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
  bool change = false;
  if (elastic_ != nullptr) {
    s = Vote(clock, &change);
    if (!s.ok()) return Reform(clock, s, stats);
  }
  // The same arithmetic as a bsp server: sum, times 1/n, then the optimizer.
  const float inv = 1.0f / static_cast<float>(RingSize());
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
  alone_grads_ = nullptr;
  if (stats != nullptr) *stats = StepStats();
  if (config_.assign_every > 0 && clock % config_.assign_every == 0) {
    RETURN_IF_ERROR(Flush(clock));
  }
  if (!change || voted_leave_) return absl::OkStatus();
  // The step is applied everywhere; the ring changes before the next.
  collective_.reset();
  s = FormRing(clock, config_.clock->Now() + config_.timeout);
  if (!s.ok()) {
    return Explain(absl::StrCat("re-forming the ring after step ", clock, ": ",
                                s.message()),
                   clock);
  }
  LOG(INFO) << "rank " << config_.rank << ": the ring re-formed after step "
            << clock << " (" << RingSays() << ")";
  if (stats != nullptr) stats->next_clock = resumed_clock_;
  return absl::OkStatus();
}

absl::Status AllreduceExchange::Vote(int64_t clock, bool* change) {
  std::vector<float> votes(RingSize(), 0.0f);
  const bool leaving = config_.leaving != nullptr && config_.leaving->load();
  votes[RingIndex()] = leaving                       ? 2.0f
                       : elastic_->OutsiderWaiting() ? 1.0f
                                                     : 0.0f;
  if (RingSize() > 1) {
    const uint32_t tag = static_cast<uint32_t>(weights_->size() + 1);
    RETURN_IF_ERROR(collective_->AllreduceSum(&votes, tag));
  }
  voted_leave_ = voted_leave_ || leaving;
  *change = std::any_of(votes.begin(), votes.end(),
                        [](float v) { return v != 0.0f; });
  if (*change) {
    std::vector<int> leavers;
    for (size_t i = 0; i < votes.size(); ++i) {
      if (votes[i] == 2.0f) leavers.push_back(elastic_->members()[i]);
    }
    LOG(INFO) << "rank " << config_.rank << ": step " << clock
              << "'s vote changes the ring"
              << (leavers.empty()
                      ? std::string(" (a rank waits to join)")
                      : absl::StrCat(" (rank ", absl::StrJoin(leavers, ", "),
                                     " leaves)"));
  }
  return absl::OkStatus();
}

absl::Status AllreduceExchange::Flush(int64_t clock) {
  if (RingIndex() != 0 || weights_ == nullptr) return absl::OkStatus();
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
  if (!config_.reform || RingSize() == 1) return Explain(what, clock);
  LOG(WARNING) << "rank " << config_.rank << ": " << what
               << "; re-forming the ring, waiting up to "
               << absl::FormatDuration(config_.timeout)
               << (elastic_ != nullptr ? " for the live ranks"
                                       : " for a replacement of the dead rank");
  // The servers' copy is what the evaluator scores and a shard restored
  // from: bring it up to date before the wait.
  if (absl::Status flushed = Flush(clock - 1); !flushed.ok()) {
    LOG(WARNING) << "handing over the weights before re-forming: " << flushed;
  }
  collective_.reset();
  ring_.Broke();
  // The step `clock` failed: this rank has completed the one before.
  absl::Status s = FormRing(clock - 1, config_.clock->Now() + config_.timeout);
  if (!s.ok()) {
    return Explain(absl::StrCat(what, "; re-forming the ring: ", s.message()),
                   clock);
  }
  LOG(WARNING) << "rank " << config_.rank << ": the ring re-formed ("
               << RingSays() << ") at step " << resumed_clock_;
  if (stats != nullptr) {
    *stats = StepStats();
    stats->next_clock = resumed_clock_;
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
      const bool in_ring = elastic_ != nullptr ? elastic_->InRing(w.rank())
                                               : w.rank() < config_.num_workers;
      if (!w.live() && w.rank() != config_.rank && in_ring) {
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
