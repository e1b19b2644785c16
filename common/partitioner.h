// The partitioner: how a model's tensors are cut into slices and which shard
// holds each slice. A pure function of the ModelSpec, so every process
// computes the same placement with no lookup service on the hot path.
//
// Cutting: a tensor is cut into contiguous runs of whole elements. The slice
// size is min(spec.slice_bytes, max(4 KiB, ceil(model bytes / (num_shards *
// 32)))), so a model smaller than slice_bytes * num_shards is still cut
// finely enough to balance; the last slice of a tensor may be shorter.
//
// Placement: slices, taken largest first (ties by tensor order, then index),
// each go to the currently least-loaded shard (ties to the lowest shard).
// Greedy placement keeps every shard's load within one slice of every other
// shard's, i.e. within 1/32 of the mean when the model is cut finely.
#ifndef ASYNCPS_COMMON_PARTITIONER_H_
#define ASYNCPS_COMMON_PARTITIONER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Slices per shard aimed for when the model is small relative to
// slice_bytes.
inline constexpr uint64_t kTargetSlicesPerShard = 32;
// The fine cut never goes below this (slice_bytes itself may).
inline constexpr uint64_t kMinFineSliceBytes = 4096;
// The most slices a model may be cut into: each is a request key, an
// optimizer state and a lock, so more is a denial of service, not a model.
inline constexpr uint64_t kMaxSlices = uint64_t{1} << 20;
// The most shards a job may have (found by fuzzing: a spec claiming 5·10^8
// shards made the partitioner allocate 4 GB of per-shard loads).
inline constexpr uint32_t kMaxShards = 1 << 16;
// Largest rank a worker may ask for, and largest job (server/membership.h
// checks both; a client and ps_worker refuse a rank outside it themselves).
inline constexpr int kMaxRank = 1 << 16;

struct SliceInfo {
  int tensor = 0;      // Index into ModelSpec.tensors.
  uint32_t index = 0;  // Slice number within its tensor.
  uint64_t begin = 0;  // First element.
  uint64_t count = 0;  // Number of elements.
  int shard = 0;       // Shard that holds it.
};

// The whole placement of a model. Immutable; safe to share between threads.
class Partition {
 public:
  // Computes the placement. Fails with INVALID_ARGUMENT if the spec is
  // unusable (no tensors, zero shards, an empty dimension, an unknown dtype).
  static absl::StatusOr<Partition> Create(const v1::ModelSpec& spec);

  int num_shards() const { return num_shards_; }
  uint64_t slice_elements() const { return slice_elements_; }
  // All slices, tensor by tensor, in index order.
  const std::vector<SliceInfo>& slices() const { return slices_; }
  // Slices of tensor `t`, in index order.
  const std::vector<int>& tensor_slices(int t) const {
    return tensor_slices_[t];
  }
  // Element count of tensor `t`.
  uint64_t tensor_elements(int t) const { return tensor_elements_[t]; }
  // Payload bytes per shard.
  std::vector<uint64_t> ShardBytes() const;

 private:
  int num_shards_ = 0;
  uint64_t slice_elements_ = 0;
  std::vector<SliceInfo> slices_;
  std::vector<std::vector<int>> tensor_slices_;
  std::vector<uint64_t> tensor_elements_;
};

// Which of `num_shards` shards holds row `id` of an embedding table (every
// table alike): a 64-bit mix of the id, so consecutive ids and skewed
// (Zipf) id streams spread their distinct ids evenly.
// REQUIRES: num_shards >= 1.
int RowShard(int64_t id, int num_shards);

// Bytes per element of `dtype`, or 0 if it is not a known dtype.
size_t DTypeSize(int dtype);

// "DTYPE_F32", ..., or "unknown dtype N".
std::string DTypeName(int dtype);

// Element count of a tensor spec, or an error on an empty or negative
// dimension or overflow.
absl::StatusOr<uint64_t> NumElements(const v1::TensorSpec& tensor);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PARTITIONER_H_
