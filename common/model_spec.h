// Checks on a ModelSpec: whether it is usable, and how two specs differ.
#ifndef ASYNCPS_COMMON_MODEL_SPEC_H_
#define ASYNCPS_COMMON_MODEL_SPEC_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/partitioner.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// Largest model a shard accepts, in payload bytes over all tensors.
// Whether `name` may name a tensor or an embedding table: 1-256
// characters of [A-Za-z0-9_./-].
bool ValidName(absl::string_view name);

// What every holder of an embedding table (the shard, and the client
// before it sends a push's parts to several shards) checks of a request's
// rows: each id inside a bounded table, and every gradient (if given)
// finite. INVALID_ARGUMENT naming the id, and the element.
// REQUIRES: grads empty or ids.size() * spec.dim() of them.
absl::Status CheckRows(const v1::EmbeddingSpec& spec,
                       absl::Span<const int64_t> ids,
                       absl::Span<const float> grads = {});

inline constexpr uint64_t kMaxModelBytes = uint64_t{64} << 30;

// OK, or INVALID_ARGUMENT naming the first problem: an empty or duplicate
// tensor name, a bad shape or dtype, a bad initializer or optimizer, a
// slice_bytes or num_shards of 0, a model over kMaxModelBytes.
absl::Status ValidateModelSpec(const v1::ModelSpec& spec);
// The same checks, and the spec's partition when they pass (so a server
// validates and partitions a spec once).
absl::StatusOr<Partition> ValidateAndPartition(const v1::ModelSpec& spec);

// "" if `a` and `b` are the same spec; otherwise a short description of
// where they differ (e.g. "modified: optimizer.learning_rate: 0.1 -> 0.2").
std::string DescribeSpecDifference(const v1::ModelSpec& a,
                                   const v1::ModelSpec& b);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_MODEL_SPEC_H_
