// ShardStore: the slices of a model that one shard holds, and the rules for
// reading and updating them. Thread-safe: pulls and pushes to different
// slices run in parallel; each slice has its own lock.
#ifndef ASYNCPS_SERVER_SHARD_STORE_H_
#define ASYNCPS_SERVER_SHARD_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/mode.h"
#include "common/optimizer.h"
#include "common/partitioner.h"
#include "proto/asyncps.pb.h"
#include "proto/checkpoint.pb.h"

namespace asyncps {

// Staleness values 0 .. kStalenessBuckets-2 have their own bucket; the last
// bucket counts everything larger.
inline constexpr int kStalenessBuckets = 64;

struct ShardCounters {
  int64_t updates_applied = 0;
  int64_t pushes = 0;
  int64_t pulls = 0;
  int64_t rejected = 0;
  int64_t dropped_stale = 0;
  int64_t dropped_late = 0;
  int64_t steps_applied = 0;
  int64_t steps_short = 0;
  std::vector<int64_t> staleness_histogram;
};

// How a push is applied, decided by the server's mode and membership.
struct PushPolicy {
  Mode mode = Mode::kAsync;
  StalePolicy stale;
  // bsp: gradients that complete a step (live workers - backup workers), and
  // the live worker count (a step applied with fewer is "short").
  int quorum = 1;
  int live_workers = 1;
  absl::Time now;
};

class ShardStore {
 public:
  // REQUIRES: 0 <= shard < num_shards. `max_shard_bytes` bounds the weights
  // this shard will hold (the optimizer's slots come on top: up to 2x more
  // for Adam); a bigger model is refused with RESOURCE_EXHAUSTED instead of
  // running the process out of memory.
  ShardStore(int shard, int num_shards, uint64_t max_response_bytes,
             uint64_t max_shard_bytes = uint64_t{4} << 30);
  ShardStore(const ShardStore&) = delete;
  ShardStore& operator=(const ShardStore&) = delete;

  // Declares the model and initialises this shard's slices from the spec's
  // seed. The same spec again is OK (created = false); a different one is
  // FAILED_PRECONDITION naming the difference; an unusable one, or one whose
  // num_shards is not this server's, is INVALID_ARGUMENT / FAILED_PRECONDITION.
  absl::StatusOr<v1::DeclareModelResponse> Declare(const v1::ModelSpec& spec);

  // Copies the requested slices and their versions into `response`.
  // On error `response` is unspecified and nothing changed.
  absl::Status Pull(const v1::PullRequest& request, v1::PullResponse* response);
  // Pull in two halves, for pulls the server holds: ResolvePull validates
  // and returns the slices; FinishPull copies them out.
  absl::StatusOr<std::vector<int>> ResolvePull(const v1::PullRequest& request);
  void FinishPull(const v1::PullRequest& request,
                  const std::vector<int>& slices, v1::PullResponse* response);

  // Validates every gradient in `request` first (known slice on this shard,
  // matching range, dtype, byte length, finite values, version not from the
  // future, no slice twice, a bsp step that is not ahead); if any fails
  // nothing is applied. Then, per slice under its lock:
  // - async/ssp: applies the optimizer (the learning rate scaled, or the
  //   gradient dropped, per `policy.stale`);
  // - bsp: adds the gradient to its step's sum; the step's mean is applied
  //   once `policy.quorum` gradients are in; a gradient for a step already
  //   applied (or a second one from the same rank) is dropped.
  absl::Status Push(const v1::PushRequest& request, const PushPolicy& policy,
                    v1::PushResponse* response);
  // Async push with no stale policy (tests, tools).
  absl::Status Push(const v1::PushRequest& request,
                    v1::PushResponse* response) {
    return Push(request, PushPolicy{}, response);
  }

  // bsp: applies every pending step that has `quorum` gradients, or whose
  // first gradient is older than `deadline` (if > 0). Returns the number of
  // steps applied.
  int CompletePendingSteps(int quorum, int live_workers,
                           absl::Duration deadline, absl::Time now);
  // bsp: true if step `clock` has been applied to every slice in `slices`.
  bool StepApplied(const std::vector<int>& slices, int64_t clock) const;

  // The whole state of this shard (weights, versions, optimizer slots, bsp
  // steps), for a checkpoint. FAILED_PRECONDITION before Declare.
  absl::StatusOr<v1::ShardCheckpoint> Snapshot() const;
  // Loads a checkpoint into an empty store: its spec is declared and every
  // slice's state restored. DATA_LOSS if it does not fit the model on this
  // shard; nothing changes on error.
  absl::Status Restore(const v1::ShardCheckpoint& checkpoint);

  // Replaces weights (allreduce mode), validated like a push's gradients;
  // each slice's version becomes the given one.
  absl::Status Assign(const v1::AssignRequest& request);

  int shard() const { return shard_; }
  // The declared spec, or FAILED_PRECONDITION before Declare.
  absl::StatusOr<v1::ModelSpec> Spec() const;
  bool declared() const;
  // Slices and payload bytes held; zero before Declare.
  uint32_t num_slices() const;
  uint64_t num_bytes() const;
  std::string model_name() const;
  ShardCounters Counters() const;
  // Counts an RPC refused before it reached the store (e.g. a bad Register).
  void CountRejected() { rejected_.fetch_add(1, std::memory_order_relaxed); }

 private:
  struct SliceState {
    explicit SliceState(const v1::OptimizerSpec& spec, size_t n)
        : weights(n), slots(spec, n) {}
    absl::Mutex mu;
    std::vector<float> weights ABSL_GUARDED_BY(mu);
    OptimizerSlots slots ABSL_GUARDED_BY(mu);
    int64_t version ABSL_GUARDED_BY(mu) = 0;
    // bsp: the last step applied, and the sum of step applied_step + 1's
    // gradients so far.
    int64_t applied_step ABSL_GUARDED_BY(mu) = 0;
    std::vector<float> step_sum ABSL_GUARDED_BY(mu);
    std::vector<int> step_ranks ABSL_GUARDED_BY(mu);
    absl::Time step_first ABSL_GUARDED_BY(mu);
  };

  // Everything fixed by Declare. Immutable once published.
  struct Model {
    v1::ModelSpec spec;
    Partition partition;
    absl::flat_hash_map<std::string, int> tensor_index;
    // Indexed like partition.slices(); null for slices on other shards.
    std::vector<std::unique_ptr<SliceState>> slices;
    uint32_t num_slices = 0;
    uint64_t num_bytes = 0;
  };

  // OK if `spec` is usable and made for this server's number of shards.
  absl::Status CheckSpec(const v1::ModelSpec& spec) const;
  // A model with this shard's slices initialised from the spec's seed.
  absl::StatusOr<std::shared_ptr<Model>> BuildModel(
      const v1::ModelSpec& spec) const;
  // Resolves `key` to a slice of this shard, or a status saying why not.
  absl::StatusOr<int> Resolve(const Model& model,
                              const v1::SliceKey& key) const;
  // Validates payloads (gradients or weights): slice, dtype, length, finite,
  // no slice twice. Fills the slice indices and decoded values.
  absl::Status ValidatePayloads(
      const Model& model,
      const google::protobuf::RepeatedPtrField<v1::SliceData>& data,
      absl::string_view what, std::vector<int>* indices,
      std::vector<std::vector<float>>* values) const;
  // bsp: applies the mean of the pending step of `state`.
  void ApplyStep(const Model& model, SliceState& state, int live_workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(state.mu);
  std::shared_ptr<const Model> model() const;
  absl::Status Reject(absl::Status status);

  // Constant after construction.
  const int shard_;
  const int num_shards_;
  const uint64_t max_response_bytes_;
  const uint64_t max_shard_bytes_;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Model> model_ ABSL_GUARDED_BY(mu_);

  std::atomic<int64_t> updates_applied_{0};
  std::atomic<int64_t> pushes_{0};
  std::atomic<int64_t> pulls_{0};
  std::atomic<int64_t> rejected_{0};
  std::atomic<int64_t> dropped_stale_{0};
  std::atomic<int64_t> dropped_late_{0};
  std::atomic<int64_t> steps_applied_{0};
  std::atomic<int64_t> steps_short_{0};
  std::vector<std::atomic<int64_t>> staleness_;

  // bsp: slices with a step pending.
  mutable absl::Mutex pending_mu_;
  absl::flat_hash_set<int> pending_ ABSL_GUARDED_BY(pending_mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_STORE_H_
