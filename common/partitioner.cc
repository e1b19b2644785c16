#include "common/partitioner.h"

#include <algorithm>
#include <limits>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/initializer.h"  // Mix64
#include "common/status_macros.h"

namespace asyncps {

size_t DTypeSize(int dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return 4;
    case v1::DTYPE_BF16:
    case v1::DTYPE_F16:
      return 2;
    default:
      return 0;
  }
}

std::string DTypeName(int dtype) {
  const std::string& name = v1::DType_Name(static_cast<v1::DType>(dtype));
  return name.empty() ? absl::StrCat("unknown dtype ", dtype) : name;
}

absl::StatusOr<uint64_t> NumElements(const v1::TensorSpec& tensor) {
  if (tensor.shape_size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", tensor.name(), "' has no shape"));
  }
  uint64_t n = 1;
  for (int64_t d : tensor.shape()) {
    if (d <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", tensor.name(), "' has dimension ", d, " (must be >= 1)"));
    }
    if (n > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensor.name(), "' is too large"));
    }
    n *= static_cast<uint64_t>(d);
  }
  return n;
}

namespace {

// Each slice's shard: largest first, each to the shard with the fewest
// elements so far; the stable sort keeps tensor and index order among
// equals.
void AssignShards(int num_shards, std::vector<SliceInfo>* slices) {
  std::vector<int> order(slices->size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [slices](int a, int b) {
    return (*slices)[a].count > (*slices)[b].count;
  });
  std::vector<uint64_t> load(num_shards, 0);
  for (int i : order) {
    const int shard = static_cast<int>(
        std::min_element(load.begin(), load.end()) - load.begin());
    (*slices)[i].shard = shard;
    load[shard] += (*slices)[i].count;
  }
}

}  // namespace

absl::StatusOr<Partition> Partition::Create(const v1::ModelSpec& spec) {
  if (spec.num_shards() == 0 || spec.num_shards() > kMaxShards) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec has num_shards = ", spec.num_shards(),
                     " (must be in [1, ", kMaxShards, "])"));
  }
  if (spec.tensors_size() == 0) {
    return absl::InvalidArgumentError("model spec has no tensors");
  }
  if (spec.slice_bytes() < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("model spec has slice_bytes = ", spec.slice_bytes(),
                     " (must be >= 4)"));
  }
  Partition p;
  p.num_shards_ = static_cast<int>(spec.num_shards());
  uint64_t total_bytes = 0;
  for (const v1::TensorSpec& t : spec.tensors()) {
    if (t.dtype() != v1::DTYPE_F32) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", t.name(), "' has dtype ",
                       DTypeName(t.dtype()), "; servers store DTYPE_F32 only"));
    }
    ASSIGN_OR_RETURN(const uint64_t n, NumElements(t));
    p.tensor_elements_.push_back(n);
    total_bytes += n * DTypeSize(v1::DTYPE_F32);
  }
  const uint64_t target =
      (total_bytes + p.num_shards_ * kTargetSlicesPerShard - 1) /
      (p.num_shards_ * kTargetSlicesPerShard);
  // Cutting finer than kMinFineSliceBytes buys no balance worth the
  // per-slice overhead.
  const uint64_t slice_bytes = std::min<uint64_t>(
      spec.slice_bytes(), std::max<uint64_t>(target, kMinFineSliceBytes));
  p.slice_elements_ =
      std::max<uint64_t>(1, slice_bytes / DTypeSize(v1::DTYPE_F32));
  // Counted before anything is built: a tiny slice_bytes on a large tensor
  // (2·10^7 elements at 4 bytes a slice) kept a shard busy for minutes on
  // one request.
  uint64_t num_slices = 0;
  for (const uint64_t n : p.tensor_elements_) {
    num_slices += (n + p.slice_elements_ - 1) / p.slice_elements_;
  }
  if (num_slices > kMaxSlices) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model spec with slice_bytes = ", spec.slice_bytes(), " cuts ",
        total_bytes, " bytes into ", num_slices, " slices, more than the ",
        kMaxSlices, " a model may have; raise slice_bytes"));
  }

  p.tensor_slices_.resize(spec.tensors_size());
  for (int t = 0; t < spec.tensors_size(); ++t) {
    const uint64_t n = p.tensor_elements_[t];
    uint32_t index = 0;
    for (uint64_t begin = 0; begin < n; begin += p.slice_elements_, ++index) {
      SliceInfo s;
      s.tensor = t;
      s.index = index;
      s.begin = begin;
      s.count = std::min(p.slice_elements_, n - begin);
      p.tensor_slices_[t].push_back(static_cast<int>(p.slices_.size()));
      p.slices_.push_back(s);
    }
  }
  AssignShards(p.num_shards_, &p.slices_);
  return p;
}

std::vector<uint64_t> Partition::ShardBytes() const {
  std::vector<uint64_t> bytes(num_shards_, 0);
  for (const SliceInfo& s : slices_)
    bytes[s.shard] += s.count * DTypeSize(v1::DTYPE_F32);
  return bytes;
}

int RowShard(int64_t id, int num_shards) {
  return static_cast<int>(Mix64(static_cast<uint64_t>(id)) %
                          static_cast<uint64_t>(num_shards));
}

}  // namespace asyncps
