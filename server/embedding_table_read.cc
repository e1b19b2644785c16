// EmbeddingTable's reads (declared in server/embedding_table.h): a paged
// read of the whole table is a snapshot, its rows as they were at its first
// page; a row changed while reads are open is first copied for them.
#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "server/embedding_table.h"

namespace asyncps {

void EmbeddingTable::KeepForSnapshotsLocked(uint32_t slot) {
  for (Snapshot& s : snapshots_) {
    if (slot >= s.held || s.kept.contains(slot)) continue;
    s.kept.emplace(slot, s.kept_ids.size());
    s.kept_ids.push_back(ids_[slot]);
    s.kept_rows.insert(s.kept_rows.end(), weights_.begin() + slot * dim_,
                       weights_.begin() + (slot + 1) * dim_);
  }
}

absl::StatusOr<int64_t> EmbeddingTable::Read(uint64_t* snapshot, int64_t start,
                                             int64_t max_rows,
                                             std::vector<int64_t>* ids,
                                             std::vector<float>* rows,
                                             absl::Time now) {
  absl::MutexLock lock(&mu_);
  // Readers gone quiet are gone: their snapshots cost every change.
  snapshots_.erase(std::remove_if(snapshots_.begin(), snapshots_.end(),
                                  [now](const Snapshot& s) {
                                    return now - s.used > kSnapshotIdle;
                                  }),
                   snapshots_.end());
  if (*snapshot == 0) {
    if (snapshots_.size() >= kMaxSnapshots) {
      return absl::ResourceExhaustedError(
          absl::StrCat(kMaxSnapshots, " reads of embedding '", spec_.name(),
                       "' are in progress; try again when one ends"));
    }
    // Numbered from a random start: a reader of a table this one replaced
    // (a restore) must not find another reader's snapshot under its number.
    if (last_snapshot_ == 0) {
      absl::BitGen random;
      last_snapshot_ = absl::Uniform<uint64_t>(random) >> 1;
    }
    Snapshot s;
    s.id = *snapshot = ++last_snapshot_;
    // Every slot below ids_.size() holds a row (an evicted row's slot is
    // taken by the new one).
    s.held = static_cast<int64_t>(ids_.size());
    snapshots_.push_back(std::move(s));
  }
  auto it = std::find_if(snapshots_.begin(), snapshots_.end(),
                         [&](const Snapshot& s) { return s.id == *snapshot; });
  if (it == snapshots_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("read ", *snapshot, " of embedding '", spec_.name(),
                     "' is not held here (it ended, was idle for ",
                     absl::FormatDuration(kSnapshotIdle),
                     ", or the shard restarted): read again from the start"));
  }
  it->used = now;
  const int64_t end = std::min(it->held, start + max_rows);
  for (int64_t slot = start; slot < end; ++slot) {
    auto kept = it->kept.find(static_cast<uint32_t>(slot));
    const bool changed = kept != it->kept.end();
    const std::vector<float>& from = changed ? it->kept_rows : weights_;
    const size_t at = (changed ? kept->second : slot) * dim_;
    ids->push_back(changed ? it->kept_ids[kept->second] : ids_[slot]);
    rows->insert(rows->end(), from.begin() + at, from.begin() + at + dim_);
  }
  if (end < it->held) return end;
  snapshots_.erase(it);
  return -1;
}

int EmbeddingTable::open_snapshots() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(snapshots_.size());
}

}  // namespace asyncps
