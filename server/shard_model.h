// ShardModel: what one shard knows of a declared model that never changes:
// the spec (validated once), its partition (computed once), and the table
// of slices this shard holds. It resolves and decodes requests; it holds no
// weights. Immutable, so safe to share between threads.
#ifndef ASYNCPS_SERVER_SHARD_MODEL_H_
#define ASYNCPS_SERVER_SHARD_MODEL_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "google/protobuf/repeated_field.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// "'tensor'#index", as errors name a slice.
std::string SliceName(const v1::SliceKey& key);

// A request's payloads, checked and as f32: values[k] is the k-th payload
// (slice indices[k]). An f32 payload is read where it lies (the request
// must outlive this); other dtypes are widened into `converted`.
struct DecodedPayloads {
  std::vector<int> indices;
  std::vector<absl::Span<const float>> values;
  std::deque<std::vector<float>> converted;  // Stable addresses.
};

class ShardModel {
 public:
  // OK if `spec` is usable and made for `num_shards` shards.
  static absl::Status CheckSpec(const v1::ModelSpec& spec, int num_shards);

  // Checks `spec`, partitions it, and checks that shard `shard`'s share is
  // at most `max_shard_bytes` (RESOURCE_EXHAUSTED otherwise).
  static absl::StatusOr<std::unique_ptr<const ShardModel>> Create(
      const v1::ModelSpec& spec, int shard, int num_shards,
      uint64_t max_shard_bytes);

  const v1::ModelSpec& spec() const { return spec_; }
  const Partition& partition() const { return partition_; }
  // Indices (into partition().slices()) of the slices on this shard.
  const std::vector<int>& local_slices() const { return local_; }
  bool IsLocal(int slice) const {
    return partition_.slices()[slice].shard == shard_;
  }
  uint32_t num_slices() const { return static_cast<uint32_t>(local_.size()); }
  uint64_t num_bytes() const { return num_bytes_; }
  // Payload bytes of slice `slice` in f32.
  uint64_t SliceBytes(int slice) const;

  // The slice `key` names, if it is a slice of this shard whose range
  // matches the partition; else NOT_FOUND or INVALID_ARGUMENT saying why.
  absl::StatusOr<int> Resolve(const v1::SliceKey& key) const;

  // Validates payloads (gradients or weights, called `what` in errors):
  // slice, dtype (any wire dtype; decoded to f32; with `compressed`, a
  // compressed gradient's too, common/compress.h), byte length,
  // non-negative version, finite values, no slice twice. With `compressed`
  // (a push's gradients) a slice may say no_gradient, with no data: its
  // value is empty. Fills `out`.
  absl::Status Decode(
      const google::protobuf::RepeatedPtrField<v1::SliceData>& data,
      absl::string_view what, DecodedPayloads* out,
      bool compressed = false) const;

 private:
  ShardModel(v1::ModelSpec spec, Partition partition, int shard);

  const v1::ModelSpec spec_;
  const Partition partition_;
  const int shard_;
  absl::flat_hash_map<std::string, int> tensor_index_;
  std::vector<int> local_;
  uint64_t num_bytes_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_SHARD_MODEL_H_
