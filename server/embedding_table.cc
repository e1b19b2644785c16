// EmbeddingTable's rows: validation, the slots and their eviction order,
// pull, push, the bsp step, reads and counts. Its checkpoint is in
// server/embedding_table_checkpoint.cc, EmbeddingTables in
// server/embedding_tables.cc.
#include "server/embedding_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/initializer.h"
#include "common/model_spec.h"
#include "common/optimizer.h"
#include "common/status_macros.h"
#include "server/bsp_step.h"

namespace asyncps {
namespace {

// The distinct ids of a request in first-seen order, and where each of the
// request's ids falls among them.
struct Distinct {
  std::vector<int64_t> ids;
  std::vector<uint32_t> of;  // of[k]: ids[k]'s index in `ids`.
};

Distinct Dedupe(absl::Span<const int64_t> ids) {
  Distinct d;
  d.of.reserve(ids.size());
  absl::flat_hash_map<int64_t, uint32_t> seen;
  seen.reserve(ids.size());
  for (int64_t id : ids) {
    auto [it, fresh] =
        seen.try_emplace(id, static_cast<uint32_t>(d.ids.size()));
    if (fresh) d.ids.push_back(id);
    d.of.push_back(it->second);
  }
  return d;
}

// Room for the request's new rows: more distinct ids than the table may
// hold would evict rows of the request itself.
absl::Status CheckRoom(const std::string& name, size_t distinct,
                       uint64_t capacity) {
  if (distinct > capacity) {
    return absl::ResourceExhaustedError(
        absl::StrCat(distinct, " distinct ids in one call to embedding '", name,
                     "', which keeps at most ", capacity,
                     " rows a shard (max_rows_per_shard)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateEmbedding(const v1::EmbeddingSpec& spec) {
  if (!ValidName(spec.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat("embedding name '", spec.name().substr(0, 64),
                     "' (want 1-256 characters of [A-Za-z0-9_./-])"));
  }
  const std::string where = absl::StrCat("embedding '", spec.name(), "': ");
  if (spec.dim() < 1 || spec.dim() > 65536) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "dim ", spec.dim(), " is not in [1, 65536]"));
  }
  if (spec.num_rows() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "num_rows ", spec.num_rows(), " is negative (0: unbounded)"));
  }
  if (spec.max_rows_per_shard() < 0 ||
      spec.max_rows_per_shard() > kMaxRowsPerShard) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "max_rows_per_shard ", spec.max_rows_per_shard(),
                     " is not in [0, ", kMaxRowsPerShard, "]"));
  }
  if (spec.admit_count() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "admit_count ", spec.admit_count(),
                     " is below 1 (1: a row at an id's first push)"));
  }
  if (spec.ttl_pushes() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "ttl_pushes ", spec.ttl_pushes(), " is negative (0: never)"));
  }
  if (!(spec.ttl_seconds() >= 0) || std::isinf(spec.ttl_seconds())) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "ttl_seconds ", spec.ttl_seconds(),
                     " is not a finite number >= 0 (0: never)"));
  }
  if (spec.ttl_pushes() > 0 && spec.ttl_seconds() > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "ttl_pushes and ttl_seconds: give one, not both"));
  }
  RETURN_IF_ERROR(ValidateInitializer(spec.init(), spec.name()));
  absl::Status optimizer = ValidateOptimizer(spec.optimizer());
  if (!optimizer.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where, optimizer.message()));
  }
  if (IsOuterOptimizer(spec.optimizer())) {
    return absl::InvalidArgumentError(absl::StrCat(
        where, "optimizer ",
        v1::OptimizerSpec::Kind_Name(spec.optimizer().kind()),
        " is an outer optimizer of the dense model; a table's rows take "
        "sgd, momentum, adam, adamw or adagrad"));
  }
  return absl::OkStatus();
}

EmbeddingTable::EmbeddingTable(const v1::EmbeddingSpec& spec)
    : spec_(spec),
      dim_(static_cast<size_t>(spec.dim())),
      slots_(OptimizerSlotCount(spec.optimizer())),
      capacity_(static_cast<uint64_t>(spec.max_rows_per_shard() > 0
                                          ? spec.max_rows_per_shard()
                                          : kMaxRowsPerShard)) {
  if (spec.admit_count() > 1) {
    absl::MutexLock lock(&mu_);
    sketch_.assign(kSketchDepth * kSketchWidth, 0);
  }
}

absl::Status EmbeddingTable::CheckIds(absl::Span<const int64_t> ids,
                                      absl::Span<const float> grads) const {
  if (ids.size() > kMaxRowsPerCall) {
    return absl::ResourceExhaustedError(
        absl::StrCat(ids.size(), " ids in one call to embedding '",
                     spec_.name(), "'; at most ", kMaxRowsPerCall));
  }
  return CheckRows(spec_, ids, grads);
}

void EmbeddingTable::Unlink(uint32_t slot) {
  const uint32_t p = prev_[slot], n = next_[slot];
  (p == kNone ? oldest_ : next_[p]) = n;
  (n == kNone ? newest_ : prev_[n]) = p;
  prev_[slot] = next_[slot] = kNone;
}

void EmbeddingTable::LinkLast(uint32_t slot) {
  prev_[slot] = newest_;
  next_[slot] = kNone;
  (newest_ == kNone ? oldest_ : next_[newest_]) = slot;
  newest_ = slot;
}

uint32_t EmbeddingTable::Touch(int64_t id) {
  if (auto it = index_.find(id); it != index_.end()) {
    Unlink(it->second);
    LinkLast(it->second);
    return it->second;
  }
  uint32_t slot;
  if (ids_.size() < capacity_) {
    slot = static_cast<uint32_t>(ids_.size());
    ids_.push_back(id);
    weights_.resize(weights_.size() + dim_);
    if (slots_ >= 1) slot1_.resize(slot1_.size() + dim_);
    if (slots_ >= 2) slot2_.resize(slot2_.size() + dim_);
    steps_.push_back(0);
    touched_.push_back(0);
    prev_.push_back(kNone);
    next_.push_back(kNone);
  } else {
    slot = oldest_;  // The least recently used row gives way.
    KeepForSnapshotsLocked(slot);
    Unlink(slot);
    index_.erase(ids_[slot]);
    ids_[slot] = id;
    ++evicted_;
  }
  index_[id] = slot;
  LinkLast(slot);
  const size_t at = size_t{slot} * dim_;
  InitialRow(id, absl::MakeSpan(&weights_[at], dim_));
  if (slots_ >= 1) {
    std::fill_n(&slot1_[at], dim_, InitialSlot1(spec_.optimizer()));
  }
  if (slots_ >= 2) std::fill_n(&slot2_[at], dim_, 0.0f);
  steps_[slot] = 0;
  return slot;
}

absl::Status EmbeddingTable::Pull(absl::Span<const int64_t> ids,
                                  absl::Span<float> rows) const {
  if (rows.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a pull of ", ids.size(), " rows of embedding '", spec_.name(),
        "' (dim ", dim_, ") into ", rows.size(), " floats"));
  }
  RETURN_IF_ERROR(CheckIds(ids));
  {
    // A pull only reads: a row not held is answered with its initial
    // values and stays not held, so a reader (an evaluator, psctl export,
    // a pull of unseen ids) neither grows the table nor evicts a row.
    absl::ReaderMutexLock lock(&mu_);
    for (size_t k = 0; k < ids.size(); ++k) {
      const absl::Span<float> to = rows.subspan(k * dim_, dim_);
      if (auto it = index_.find(ids[k]); it != index_.end()) {
        std::copy_n(&weights_[size_t{it->second} * dim_], dim_, to.data());
      } else {
        InitialRow(ids[k], to);
      }
    }
  }
  pulled_.fetch_add(static_cast<int64_t>(ids.size()));
  return absl::OkStatus();
}

void EmbeddingTable::InitialRow(int64_t id, absl::Span<float> row) const {
  // Element j of row `id` is element id * dim + j of the table's stream.
  FillInitial(spec_.init(), spec_.seed(), spec_.name(),
              static_cast<uint64_t>(id) * dim_, row);
}

absl::Status EmbeddingTable::CheckPush(absl::Span<const int64_t> ids,
                                       absl::Span<const float> grads) const {
  if (grads.size() != ids.size() * dim_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a push of ", grads.size(), " floats for ", ids.size(),
        " rows of embedding '", spec_.name(), "' (dim ", dim_, ")"));
  }
  return CheckIds(ids, grads);
}

absl::Status EmbeddingTable::Push(absl::Span<const int64_t> ids,
                                  absl::Span<const float> grads,
                                  float lr_scale) {
  RETURN_IF_ERROR(CheckPush(ids, grads));
  absl::MutexLock lock(&mu_);
  const Distinct d = Dedupe(ids);
  RETURN_IF_ERROR(CheckRoom(spec_.name(), d.ids.size(), capacity_));
  // A repeated id's gradients are summed before its one update.
  std::vector<float> summed;
  absl::Span<const float> g = grads;
  if (d.ids.size() < ids.size()) {
    summed.assign(d.ids.size() * dim_, 0.0f);
    for (size_t k = 0; k < ids.size(); ++k) {
      float* to = &summed[size_t{d.of[k]} * dim_];
      const float* from = &grads[k * dim_];
      for (size_t j = 0; j < dim_; ++j) to[j] += from[j];
    }
    g = summed;
  }
  ApplyLocked(d.ids, g, lr_scale);
  return absl::OkStatus();
}

void EmbeddingTable::ApplyLocked(absl::Span<const int64_t> ids,
                                 absl::Span<const float> grads,
                                 float lr_scale) {
  ++table_pushes_;
  const int64_t stamp = StampLocked();
  int64_t applied = 0;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (!sketch_.empty() && !index_.contains(ids[i]) && !AdmitLocked(ids[i])) {
      ++not_admitted_;  // Its gradient is dropped.
      continue;
    }
    ++applied;
    const uint32_t slot = Touch(ids[i]);
    touched_[slot] = stamp;
    KeepForSnapshotsLocked(slot);
    const size_t at = size_t{slot} * dim_;
    const absl::Span<float> none;
    ApplyOptimizer(spec_.optimizer(), lr_scale, &steps_[at / dim_],
                   grads.subspan(i * dim_, dim_),
                   slots_ >= 1 ? absl::MakeSpan(&slot1_[at], dim_) : none,
                   slots_ >= 2 ? absl::MakeSpan(&slot2_[at], dim_) : none,
                   absl::MakeSpan(&weights_[at], dim_));
  }
  pushed_ += applied;
  ExpireLocked();
}

absl::Status EmbeddingTable::AddToStep(int rank, int64_t clock,
                                       absl::Span<const int64_t> ids,
                                       absl::Span<const float> grads,
                                       int quorum, absl::Time now) {
  RETURN_IF_ERROR(CheckPush(ids, grads));
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(CheckRoom(spec_.name(), ids.size(), capacity_));
  if (!steps_known_) {
    steps_known_ = true;
    applied_step_ = clock - 1;
    ClearStepLocked();
  } else if (clock > applied_step_ + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "bsp step ", clock, " of embedding '", spec_.name(),
        "' pushed before step ", applied_step_ + 1,
        " was applied on this shard (a bsp worker pulls the table from every "
        "shard each step before it pushes the next)"));
  }
  if (clock <= applied_step_) return absl::OkStatus();  // Late: dropped.
  // A rank's second push of the step (after a prefetching one) adds to
  // its share: only its first counts towards the quorum.
  const bool first = std::find(step_ranks_.begin(), step_ranks_.end(), rank) ==
                     step_ranks_.end();
  if (step_ranks_.empty()) step_first_ = now;
  if (first) step_ranks_.push_back(rank);
  for (size_t k = 0; k < ids.size(); ++k) {
    auto [it, fresh] = step_index_.try_emplace(
        ids[k], static_cast<uint32_t>(step_ids_.size()));
    if (fresh) {
      step_ids_.push_back(ids[k]);
      step_sum_.resize(step_sum_.size() + dim_, 0.0f);
    }
    float* to = &step_sum_[size_t{it->second} * dim_];
    for (size_t j = 0; j < dim_; ++j) to[j] += grads[k * dim_ + j];
  }
  if (static_cast<int>(step_ranks_.size()) >= quorum) ApplyStepLocked();
  return absl::OkStatus();
}

void EmbeddingTable::ApplyStepLocked() {
  const float inv = 1.0f / static_cast<float>(step_ranks_.size());
  for (float& g : step_sum_) g *= inv;
  ApplyLocked(step_ids_, step_sum_, 1.0f);
  ++applied_step_;
  ClearStepLocked();
}

void EmbeddingTable::ClearStepLocked() {
  step_ranks_.clear();
  step_index_.clear();
  step_ids_.clear();
  step_sum_.clear();
}

bool EmbeddingTable::CompleteStep(int quorum, absl::Duration deadline,
                                  absl::Time now) {
  absl::MutexLock lock(&mu_);
  if (!StepDue(step_ranks_, quorum, deadline, step_first_, now)) return false;
  ApplyStepLocked();
  return true;
}

bool EmbeddingTable::Heal(const std::vector<int>& live_ranks,
                          const NotSending& not_sending, absl::Duration bound,
                          absl::Time now, std::vector<int>* left_out) {
  absl::MutexLock lock(&mu_);
  if (!MayHeal(step_ranks_, step_first_, applied_step_ + 1, live_ranks,
               not_sending, bound, now, left_out)) {
    return false;
  }
  ApplyStepLocked();
  return true;
}

bool EmbeddingTable::StepApplied(int64_t clock) const {
  absl::MutexLock lock(&mu_);
  return !steps_known_ || applied_step_ >= clock;
}

int64_t EmbeddingTable::applied_step() const {
  absl::MutexLock lock(&mu_);
  return applied_step_;
}

v1::EmbeddingStats EmbeddingTable::Stats() const {
  absl::MutexLock lock(&mu_);
  v1::EmbeddingStats s;
  s.set_name(spec_.name());
  s.set_dim(spec_.dim());
  s.set_rows(static_cast<int64_t>(index_.size()));
  s.set_evicted(evicted_);
  s.set_rows_pulled(pulled_.load());
  s.set_rows_pushed(pushed_);
  s.set_bytes_received(bytes_received_.load());
  s.set_bytes_sent(bytes_sent_.load());
  s.set_duplicate_pushes(duplicates_.load());
  s.set_expired(expired_);
  s.set_not_admitted(not_admitted_);
  return s;
}

int64_t EmbeddingTable::rows() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(index_.size());
}

int64_t EmbeddingTable::evicted() const {
  absl::MutexLock lock(&mu_);
  return evicted_;
}

int64_t EmbeddingTable::steps(int64_t id) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(id);
  return it == index_.end() ? 0 : steps_[it->second];
}

}  // namespace asyncps
