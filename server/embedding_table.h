// EmbeddingTable: one shard's part of a sparse embedding table
// (v1::EmbeddingSpec, docs/SPARSE.md): the rows whose ids hash to this shard
// (RowShard), each with its own optimizer state and step count. A row is
// made by its first push (or, with admit_count, its admit_count-th), from
// the initializer (the same values on every shard and at every restart),
// and removed when untouched past ttl_pushes or ttl_seconds; rows are pulled by
// id in the caller's order, and pushed by id: the gradients of a repeated id
// are summed, then the optimizer is applied once to each distinct row and to no
// other (Adam is "lazy": a row not pushed is not decayed). A pull only reads: a
// row not held is answered with its initial values and is not stored, so
// whoever pulls (a worker, an evaluator, psctl export) neither grows the table
// nor evicts a trained row. With max_rows_per_shard, a new row takes the place
// of the least recently pushed one.
//
// In bsp a push is added to the table's step instead (AddToStep): the
// step's mean, each row's summed gradient over the number of ranks that
// pushed the step, is applied once a quorum of ranks did, as DDP would
// average a dense embedding's gradient.
//
// Every request is checked whole before anything changes: an id outside a
// bounded table, a buffer of the wrong size, a NaN or infinite gradient or
// too many ids are refused with a status naming what was wrong, and no row
// moves. Thread-safe.
#ifndef ASYNCPS_SERVER_EMBEDDING_TABLE_H_
#define ASYNCPS_SERVER_EMBEDDING_TABLE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/partitioner.h"  // RowShard
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"
#include "server/bsp_step.h"
#include "server/push_ledger.h"

namespace asyncps {

// The most ids one Pull or Push may carry.
inline constexpr size_t kMaxRowsPerCall = size_t{1} << 20;
// The most rows one shard may hold of one table.
inline constexpr int64_t kMaxRowsPerShard = int64_t{1} << 31;
// A read's snapshot not read from for this long is dropped (its reader is
// gone); at most kMaxSnapshots are open at once per table.
inline constexpr absl::Duration kSnapshotIdle = absl::Seconds(60);
inline constexpr size_t kMaxSnapshots = 4;

// INVALID_ARGUMENT naming the field if `spec` is unusable (name, dim,
// num_rows, max_rows_per_shard, initializer, optimizer).
absl::Status ValidateEmbedding(const v1::EmbeddingSpec& spec);

class EmbeddingTable {
 public:
  // REQUIRES: ValidateEmbedding(spec).ok().
  explicit EmbeddingTable(const v1::EmbeddingSpec& spec);
  EmbeddingTable(const EmbeddingTable&) = delete;
  EmbeddingTable& operator=(const EmbeddingTable&) = delete;

  const v1::EmbeddingSpec& spec() const { return spec_; }

  // Copies the rows of `ids` into `rows` (ids.size() x dim, in the ids'
  // order): a row not held gets its initial values, and the table does not
  // change (no row made, none evicted, the eviction order kept).
  // INVALID_ARGUMENT for an id outside [0, num_rows) of a bounded table or
  // `rows` of another size; RESOURCE_EXHAUSTED for more than
  // kMaxRowsPerCall ids.
  absl::Status Pull(absl::Span<const int64_t> ids,
                    absl::Span<float> rows) const;

  // Applies `grads` (ids.size() x dim, row k for ids[k]) with the learning
  // rate times `lr_scale`. Errors as for Pull, and INVALID_ARGUMENT naming
  // the id and element of a gradient that is not finite.
  absl::Status Push(absl::Span<const int64_t> ids,
                    absl::Span<const float> grads, float lr_scale = 1.0f);

  // bsp: adds `rank`'s gradients (checked as Push checks them) to step
  // `clock`; the step's mean is applied once `quorum` ranks pushed it (an
  // empty push counts: the rank had no rows here). A second push of the
  // rank for the step adds to the step while it waits; a push for a step
  // applied is dropped (OK). Until
  // the first, the table's step is not known (it was made or restored on
  // this shard): that push says the job completed step clock - 1. Later, a
  // push for a step past the next is FAILED_PRECONDITION (a bsp worker
  // pulls step c - 1 from every shard before it pushes step c).
  absl::Status AddToStep(int rank, int64_t clock, absl::Span<const int64_t> ids,
                         absl::Span<const float> grads, int quorum,
                         absl::Time now);
  // bsp: applies the pending step if `quorum` ranks pushed it, or its
  // first push came `deadline` (if > 0) before `now`; true if it did.
  bool CompleteStep(int quorum, absl::Duration deadline, absl::Time now);
  // bsp healing, as SliceState::Heal: the pending step, begun at least
  // `bound` before `now`, whose missing ranks of `live_ranks` are all in
  // `not_sending` (MayHeal), is applied with the pushes it has;
  // `*left_out` gets the ranks left out. True if it did.
  bool Heal(const std::vector<int>& live_ranks, const NotSending& not_sending,
            absl::Duration bound, absl::Time now, std::vector<int>* left_out);
  // bsp: true once step `clock` is applied here, or while the table's
  // step is not known (made or restored on this shard, no bsp push yet:
  // its rows are all it has).
  bool StepApplied(int64_t clock) const;
  int64_t applied_step() const;

  // A paged read of the whole table (psctl export) that is a snapshot: the
  // rows held at its first page, with their values then, each once,
  // whatever pushes and evictions come between the pages. With `*snapshot`
  // 0 it opens one (setting `*snapshot`); each page passes it back with
  // the last page's next start. Appends up to `max_rows` rows from
  // position `start` to `ids` and `rows`; returns the next page's start,
  // or -1 after the last (which ends the snapshot).
  // FAILED_PRECONDITION for a snapshot this table does not hold (ended,
  // left idle past kSnapshotIdle, or the shard restarted): read again from
  // the start. A change to a row while snapshots are open first copies
  // its values for them, so an open snapshot costs the rows changed since.
  absl::StatusOr<int64_t> Read(uint64_t* snapshot, int64_t start,
                               int64_t max_rows, std::vector<int64_t>* ids,
                               std::vector<float>* rows, absl::Time now);
  // Snapshots open now (for tests).
  int open_snapshots() const;

  // The table as a checkpoint holds it, and a table made from one (its
  // spec checked, its rows' sizes, ids and bounds too: DATA_LOSS saying
  // what is wrong). With `pending` (a replica's snapshot), also its bsp
  // steps: the last applied and the one in progress, so a backup that
  // loads it completes the step as its primary does; without (a
  // checkpoint file), a loaded table learns its step from the first push.
  void Save(v1::EmbeddingCheckpoint* out, bool pending = false) const;
  static absl::StatusOr<std::unique_ptr<EmbeddingTable>> Load(
      const v1::EmbeddingCheckpoint& in);

  // Rows held, evicted, pulled (ids answered) and pushed (row updates),
  // the bytes of calls and retries answered since the start; counts only,
  // for Stats and metrics.
  v1::EmbeddingStats Stats() const;
  // Counts a call's bytes of ids and rows (server/rows.cc), and a retried
  // push answered from the ledger.
  void CountBytes(size_t received, size_t sent) {
    bytes_received_.fetch_add(static_cast<int64_t>(received));
    bytes_sent_.fetch_add(static_cast<int64_t>(sent));
  }
  void CountDuplicatePush() { duplicates_.fetch_add(1); }

  // The clock ttl_seconds reads (absl::Now unless a test sets another).
  void set_clock_for_testing(absl::Time (*clock)()) { clock_ = clock; }

  // Rows held now, and rows evicted to make room since the start.
  int64_t rows() const;
  int64_t evicted() const;
  // The step count of row `id` (0 if not held), for tests and checkpoints.
  int64_t steps(int64_t id) const;

 private:
  static constexpr uint32_t kNone = ~uint32_t{0};

  // A push's checks (Push, AddToStep): `grads` of ids.size() rows, then
  // CheckIds.
  absl::Status CheckPush(absl::Span<const int64_t> ids,
                         absl::Span<const float> grads) const;
  // The checks both calls share (of `grads` too, for a push): the call's
  // size, then CheckRows.
  absl::Status CheckIds(absl::Span<const int64_t> ids,
                        absl::Span<const float> grads = {}) const;
  // Row `id`'s initial values into `row` (dim_ floats).
  void InitialRow(int64_t id, absl::Span<float> row) const;
  // The slot of `id`, made (and initialized) if new, and marked most
  // recently used. REQUIRES: CheckIds passed for it.
  uint32_t Touch(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Applies `grads` (row i for ids[i], distinct ids) with the learning
  // rate times `lr_scale`.
  void ApplyLocked(absl::Span<const int64_t> ids, absl::Span<const float> grads,
                   float lr_scale) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Load's part for the bsp steps a replica's snapshot holds.
  absl::Status LoadStepLocked(const v1::EmbeddingCheckpoint& in)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // bsp: applies the pending step's mean and starts the next.
  void ApplyStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ClearStepLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Admission and expiry (server/embedding_rows_policy.cc). Whether `id`,
  // not held, gets a row at this push (counting the push towards it).
  bool AdmitLocked(int64_t id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What touched_ records for a push now: the table's pushes, or unix
  // seconds with ttl_seconds.
  int64_t StampLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the rows untouched past the ttl, least recently pushed first.
  void ExpireLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the row of `slot`; the last slot's row moves into it (open
  // reads keep both as they were).
  void RemoveSlotLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before slot `slot`'s id or weights change: copies them into every
  // open snapshot that reads the slot and has no copy yet.
  void KeepForSnapshotsLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Unlink(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LinkLast(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const v1::EmbeddingSpec spec_;
  const size_t dim_;
  const int slots_;  // Optimizer slots per weight (0, 1 or 2).
  const uint64_t capacity_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<int64_t, uint32_t> index_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> ids_ ABSL_GUARDED_BY(mu_);  // By slot.
  // By slot, dim_ each.
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::vector<float> slot1_ ABSL_GUARDED_BY(mu_);
  std::vector<float> slot2_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> steps_ ABSL_GUARDED_BY(mu_);  // By slot.
  // Least recently used first: a list through the slots.
  std::vector<uint32_t> prev_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> next_ ABSL_GUARDED_BY(mu_);
  uint32_t oldest_ ABSL_GUARDED_BY(mu_) = kNone;
  uint32_t newest_ ABSL_GUARDED_BY(mu_) = kNone;
  int64_t evicted_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t pushed_ ABSL_GUARDED_BY(mu_) = 0;
  // Admission's count-min sketch (kSketchDepth rows of kSketchWidth
  // saturating counters; empty without admit_count > 1), each slot's last
  // push (StampLocked), the table's pushes, and the rows expired and the
  // row pushes not admitted since the start.
  static constexpr size_t kSketchDepth = 4;
  static constexpr size_t kSketchWidth = size_t{1} << 20;
  std::vector<uint16_t> sketch_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> touched_ ABSL_GUARDED_BY(mu_);
  int64_t table_pushes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t expired_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t not_admitted_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time (*clock_)() = absl::Now;
  // bsp: the last step applied (known once a bsp push came), and the sum
  // of step applied_step_ + 1's gradients so far by row (step_ids_[i]'s at
  // step_sum_[i * dim_]), from step_ranks_, the first at step_first_.
  int64_t applied_step_ ABSL_GUARDED_BY(mu_) = 0;
  bool steps_known_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<int> step_ranks_ ABSL_GUARDED_BY(mu_);
  absl::Time step_first_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<int64_t, uint32_t> step_index_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> step_ids_ ABSL_GUARDED_BY(mu_);
  std::vector<float> step_sum_ ABSL_GUARDED_BY(mu_);
  // Reads in progress (Read): each the slots held at its first page, and
  // the id and weights of each of those slots changed since, as they were.
  struct Snapshot {
    uint64_t id = 0;
    int64_t held = 0;
    absl::Time used;
    absl::flat_hash_map<uint32_t, size_t> kept;  // Slot -> its copy's index.
    std::vector<int64_t> kept_ids;
    std::vector<float> kept_rows;  // dim_ each.
  };
  std::vector<Snapshot> snapshots_ ABSL_GUARDED_BY(mu_);
  uint64_t last_snapshot_ ABSL_GUARDED_BY(mu_) = 0;
  mutable std::atomic<int64_t> pulled_{0};
  std::atomic<int64_t> bytes_received_{0};
  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> duplicates_{0};
};

// Every embedding table of a shard, by name (DeclareEmbedding, PullRows,
// PushRows). Tables are never removed. Thread-safe.
class EmbeddingTables {
 public:
  // The most tables a shard holds.
  static constexpr size_t kMaxTables = 256;

  // OK if `spec` is the very spec declared under its name before, or new
  // and `may_create` is OK (the table is made; else that status);
  // FAILED_PRECONDITION if another spec has the name; INVALID_ARGUMENT as
  // ValidateEmbedding says; RESOURCE_EXHAUSTED beyond kMaxTables.
  absl::Status Declare(const v1::EmbeddingSpec& spec,
                       const absl::Status& may_create = absl::OkStatus());
  // The table named `name` (valid as long as this object), or NOT_FOUND
  // saying to declare it.
  absl::StatusOr<EmbeddingTable*> Find(const std::string& name) const;
  size_t size() const;
  // Every table (valid as long as this object, until a Restore).
  std::vector<EmbeddingTable*> All() const;

  // Every table into `checkpoint`, and every table of one (replacing
  // those held; on error none is replaced).
  void Save(v1::ShardCheckpoint* checkpoint) const;
  // Each table's Stats, by name.
  std::vector<v1::EmbeddingStats> Stats() const;
  absl::Status Restore(const v1::ShardCheckpoint& checkpoint);

  // What makes pushes of rows exactly-once (server/rows.cc).
  RowsLedger& ledger() { return ledger_; }

  // bsp housekeeping of every table (a tick's, or a backup's replay of
  // its primary's): each pending step applied once `quorum` ranks pushed
  // it or its first push came `deadline` (if > 0) before `now`; with
  // `heal_after` > 0, healed as EmbeddingTable::Heal says. Returns the
  // steps applied; each healed one is described in `healed`.
  int AdvanceSteps(int quorum, absl::Duration deadline, absl::Time now,
                   absl::Duration heal_after,
                   const std::vector<int>& live_ranks,
                   const NotSending& not_sending,
                   std::vector<std::string>* healed);

 private:
  RowsLedger ledger_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<EmbeddingTable>> tables_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EMBEDDING_TABLE_H_
