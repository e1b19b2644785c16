// EmbeddingTable's admission and expiry (declared in
// server/embedding_table.h; v1::EmbeddingSpec admit_count, ttl_pushes,
// ttl_seconds): a count-min sketch that counts an id's pushes until it may
// have a row, and the removal of rows untouched past their ttl, least
// recently pushed first, without holes (the last slot's row moves in).
#include <algorithm>
#include <cmath>

#include "server/embedding_table.h"

namespace asyncps {
namespace {

// One of the sketch's hash functions (splitmix64's finalizer over the id
// and the row): fixed, so counts in a checkpoint mean the same after it.
size_t SketchColumn(int64_t id, size_t row, size_t width) {
  uint64_t z = static_cast<uint64_t>(id) + 0x9e3779b97f4a7c15ull * (row + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return static_cast<size_t>((z ^ (z >> 31)) % width);
}

}  // namespace

bool EmbeddingTable::AdmitLocked(int64_t id) {
  // Conservative update: only the counters at the estimate (the least of
  // them) go up, so the estimate overcounts less under collisions.
  size_t at[kSketchDepth];
  uint16_t estimate = UINT16_MAX;
  for (size_t r = 0; r < kSketchDepth; ++r) {
    at[r] = r * kSketchWidth + SketchColumn(id, r, kSketchWidth);
    estimate = std::min(estimate, sketch_[at[r]]);
  }
  if (estimate < UINT16_MAX) ++estimate;
  for (size_t r = 0; r < kSketchDepth; ++r) {
    sketch_[at[r]] = std::max(sketch_[at[r]], estimate);
  }
  return estimate >= spec_.admit_count();
}

int64_t EmbeddingTable::StampLocked() const {
  if (spec_.ttl_seconds() > 0) return absl::ToUnixSeconds(clock_());
  return table_pushes_;
}

void EmbeddingTable::ExpireLocked() {
  const bool by_time = spec_.ttl_seconds() > 0;
  if (!by_time && spec_.ttl_pushes() <= 0) return;
  const int64_t now = StampLocked();
  const double ttl =
      by_time ? spec_.ttl_seconds() : static_cast<double>(spec_.ttl_pushes());
  // The least recently pushed row is the oldest: stop at the first fresh.
  while (oldest_ != kNone && now - touched_[oldest_] >= ttl) {
    RemoveSlotLocked(oldest_);
    ++expired_;
  }
}

void EmbeddingTable::RemoveSlotLocked(uint32_t slot) {
  KeepForSnapshotsLocked(slot);
  Unlink(slot);
  index_.erase(ids_[slot]);
  const uint32_t last = static_cast<uint32_t>(ids_.size() - 1);
  if (slot != last) {
    KeepForSnapshotsLocked(last);
    const size_t to = size_t{slot} * dim_, from = size_t{last} * dim_;
    ids_[slot] = ids_[last];
    std::copy_n(&weights_[from], dim_, &weights_[to]);
    if (slots_ >= 1) std::copy_n(&slot1_[from], dim_, &slot1_[to]);
    if (slots_ >= 2) std::copy_n(&slot2_[from], dim_, &slot2_[to]);
    steps_[slot] = steps_[last];
    touched_[slot] = touched_[last];
    // The moved row keeps its place in the order of use.
    prev_[slot] = prev_[last];
    next_[slot] = next_[last];
    (prev_[slot] == kNone ? oldest_ : next_[prev_[slot]]) = slot;
    (next_[slot] == kNone ? newest_ : prev_[next_[slot]]) = slot;
    index_[ids_[slot]] = slot;
  }
  ids_.pop_back();
  weights_.resize(weights_.size() - dim_);
  if (slots_ >= 1) slot1_.resize(slot1_.size() - dim_);
  if (slots_ >= 2) slot2_.resize(slot2_.size() - dim_);
  steps_.pop_back();
  touched_.pop_back();
  prev_.pop_back();
  next_.pop_back();
}

}  // namespace asyncps
