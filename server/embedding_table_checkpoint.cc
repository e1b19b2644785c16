// EmbeddingTable's checkpoint (declared in server/embedding_table.h): a
// table saved as v1::EmbeddingCheckpoint, its rows least recently used
// first, and a table loaded from one, every size, id and bound checked.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/embedding_table.h"

namespace asyncps {
namespace {

template <typename T>
std::string BytesOf(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()),
                     v.size() * sizeof(T));
}

// `bytes` as `n` values of T, or DATA_LOSS naming `what`.
template <typename T>
absl::StatusOr<std::vector<T>> ValuesOf(const std::string& bytes, size_t n,
                                        absl::string_view what) {
  if (bytes.size() != n * sizeof(T)) {
    return absl::DataLossError(absl::StrCat("embedding checkpoint: ", what,
                                            " holds ", bytes.size(),
                                            " bytes, want ", n * sizeof(T)));
  }
  std::vector<T> v(n);
  // memcpy of nothing into an empty vector's null data() is undefined.
  if (n > 0) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

}  // namespace

absl::Status EmbeddingTable::LoadStepLocked(const v1::EmbeddingCheckpoint& in) {
  const size_t n = in.step_ids().size() / sizeof(int64_t);
  ASSIGN_OR_RETURN(step_ids_, ValuesOf<int64_t>(in.step_ids(), n, "step_ids"));
  ASSIGN_OR_RETURN(step_sum_,
                   ValuesOf<float>(in.step_sum(), n * dim_, "step_sum"));
  for (size_t k = 0; k < n; ++k) {
    if (!step_index_.try_emplace(step_ids_[k], static_cast<uint32_t>(k))
             .second) {
      return absl::DataLossError(absl::StrCat("embedding checkpoint: step row ",
                                              step_ids_[k], " appears twice"));
    }
  }
  if (!in.steps_known() && (n > 0 || in.step_ranks_size() > 0)) {
    return absl::DataLossError(
        "embedding checkpoint: a step in progress with no step known");
  }
  applied_step_ = in.applied_step();
  steps_known_ = in.steps_known();
  step_ranks_.assign(in.step_ranks().begin(), in.step_ranks().end());
  step_first_ = absl::FromUnixNanos(in.step_first_unix_nanos());
  return absl::OkStatus();
}

void EmbeddingTable::Save(v1::EmbeddingCheckpoint* out, bool pending) const {
  absl::MutexLock lock(&mu_);
  *out->mutable_spec() = spec_;
  out->set_evicted(evicted_);
  // Least recently used first, so a restored table evicts in the same
  // order.
  std::vector<int64_t> ids, steps, touched;
  std::vector<float> weights, slot1, slot2;
  for (uint32_t s = oldest_; s != kNone; s = next_[s]) {
    const size_t at = size_t{s} * dim_;
    ids.push_back(ids_[s]);
    steps.push_back(steps_[s]);
    touched.push_back(touched_[s]);
    weights.insert(weights.end(), &weights_[at], &weights_[at] + dim_);
    if (slots_ >= 1) slot1.insert(slot1.end(), &slot1_[at], &slot1_[at] + dim_);
    if (slots_ >= 2) slot2.insert(slot2.end(), &slot2_[at], &slot2_[at] + dim_);
  }
  out->set_ids(BytesOf(ids));
  out->set_steps(BytesOf(steps));
  out->set_weights(BytesOf(weights));
  out->set_slot1(BytesOf(slot1));
  out->set_slot2(BytesOf(slot2));
  out->set_touched(BytesOf(touched));
  out->set_admit_sketch(BytesOf(sketch_));
  out->set_table_pushes(table_pushes_);
  out->set_expired(expired_);
  out->set_not_admitted(not_admitted_);
  if (!pending) return;
  out->set_applied_step(applied_step_);
  out->set_steps_known(steps_known_);
  for (int rank : step_ranks_) out->add_step_ranks(rank);
  out->set_step_first_unix_nanos(absl::ToUnixNanos(step_first_));
  out->set_step_ids(BytesOf(step_ids_));
  out->set_step_sum(BytesOf(step_sum_));
}

absl::StatusOr<std::unique_ptr<EmbeddingTable>> EmbeddingTable::Load(
    const v1::EmbeddingCheckpoint& in) {
  absl::Status valid = ValidateEmbedding(in.spec());
  if (!valid.ok()) {
    return absl::DataLossError(
        absl::StrCat("embedding checkpoint: ", valid.message()));
  }
  auto table = std::make_unique<EmbeddingTable>(in.spec());
  const size_t n = in.ids().size() / sizeof(int64_t);
  const size_t d = table->dim_;
  ASSIGN_OR_RETURN(std::vector<int64_t> ids,
                   ValuesOf<int64_t>(in.ids(), n, "ids"));
  ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                   ValuesOf<int64_t>(in.steps(), n, "steps"));
  ASSIGN_OR_RETURN(std::vector<float> weights,
                   ValuesOf<float>(in.weights(), n * d, "weights"));
  ASSIGN_OR_RETURN(
      std::vector<float> slot1,
      ValuesOf<float>(in.slot1(), table->slots_ >= 1 ? n * d : 0, "slot1"));
  ASSIGN_OR_RETURN(
      std::vector<float> slot2,
      ValuesOf<float>(in.slot2(), table->slots_ >= 2 ? n * d : 0, "slot2"));
  // A checkpoint from before expiry has no stamps: its rows count as
  // pushed at its last push.
  std::vector<int64_t> touched(n, in.table_pushes());
  if (!in.touched().empty()) {
    ASSIGN_OR_RETURN(touched, ValuesOf<int64_t>(in.touched(), n, "touched"));
  }
  if (n > table->capacity_) {
    return absl::DataLossError(absl::StrCat("embedding checkpoint: ", n,
                                            " rows of '", in.spec().name(),
                                            "', more than max_rows_per_shard"));
  }
  absl::MutexLock lock(&table->mu_);
  for (size_t k = 0; k < n; ++k) {
    const int64_t rows = in.spec().num_rows();
    if (rows > 0 && (ids[k] < 0 || ids[k] >= rows)) {
      return absl::DataLossError(
          absl::StrCat("embedding checkpoint: id ", ids[k], " is outside '",
                       in.spec().name(), "' of ", rows, " rows"));
    }
    if (table->index_.contains(ids[k])) {
      return absl::DataLossError(absl::StrCat("embedding checkpoint: id ",
                                              ids[k], " of '", in.spec().name(),
                                              "' appears twice"));
    }
    const uint32_t slot = table->Touch(ids[k]);
    const size_t at = size_t{slot} * d;
    std::copy_n(&weights[k * d], d, &table->weights_[at]);
    if (table->slots_ >= 1) std::copy_n(&slot1[k * d], d, &table->slot1_[at]);
    if (table->slots_ >= 2) std::copy_n(&slot2[k * d], d, &table->slot2_[at]);
    table->steps_[slot] = steps[k];
    table->touched_[slot] = touched[k];
  }
  table->evicted_ = in.evicted();
  table->table_pushes_ = in.table_pushes();
  table->expired_ = in.expired();
  table->not_admitted_ = in.not_admitted();
  // As big as the spec's admission made it (empty without).
  ASSIGN_OR_RETURN(table->sketch_,
                   ValuesOf<uint16_t>(in.admit_sketch(), table->sketch_.size(),
                                      "admit_sketch"));
  RETURN_IF_ERROR(table->LoadStepLocked(in));
  return table;
}

}  // namespace asyncps
