#include "server/shard_model.h"

#include <cmath>
#include <deque>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/compress.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

namespace asyncps {

std::string SliceName(const v1::SliceKey& key) {
  return absl::StrCat("'", key.tensor(), "'#", key.index());
}

namespace {

absl::Status CheckShards(const v1::ModelSpec& spec, int num_shards) {
  if (static_cast<int>(spec.num_shards()) != num_shards) {
    return absl::FailedPreconditionError(
        absl::StrCat("model spec says num_shards = ", spec.num_shards(),
                     " but this server runs with --num_shards=", num_shards));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardModel::CheckSpec(const v1::ModelSpec& spec, int num_shards) {
  RETURN_IF_ERROR(ValidateModelSpec(spec));
  return CheckShards(spec, num_shards);
}

absl::StatusOr<std::unique_ptr<const ShardModel>> ShardModel::Create(
    const v1::ModelSpec& spec, int shard, int num_shards,
    uint64_t max_shard_bytes) {
  ASSIGN_OR_RETURN(Partition partition, ValidateAndPartition(spec));
  RETURN_IF_ERROR(CheckShards(spec, num_shards));
  const uint64_t mine = partition.ShardBytes()[shard];
  if (mine > max_shard_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this model puts ", mine, " bytes of weights on shard ",
                     shard, ", over its --max_shard_bytes=", max_shard_bytes,
                     "; use more shards or raise the limit"));
  }
  return std::unique_ptr<const ShardModel>(
      new ShardModel(spec, std::move(partition), shard));
}

ShardModel::ShardModel(v1::ModelSpec spec, Partition partition, int shard)
    : spec_(std::move(spec)), partition_(std::move(partition)), shard_(shard) {
  for (int t = 0; t < spec_.tensors_size(); ++t) {
    tensor_index_[spec_.tensors(t).name()] = t;
  }
  for (size_t i = 0; i < partition_.slices().size(); ++i) {
    if (!IsLocal(static_cast<int>(i))) continue;
    local_.push_back(static_cast<int>(i));
    num_bytes_ += SliceBytes(static_cast<int>(i));
  }
}

uint64_t ShardModel::SliceBytes(int slice) const {
  return partition_.slices()[slice].count * kF32Bytes;
}

absl::StatusOr<int> ShardModel::Resolve(const v1::SliceKey& key) const {
  auto it = tensor_index_.find(key.tensor());
  if (it == tensor_index_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown tensor '", key.tensor(), "'"));
  }
  const int t = it->second;
  const std::vector<int>& slices = partition_.tensor_slices(t);
  if (key.index() >= slices.size()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", key.tensor(), "' has ", slices.size(),
                     " slices; there is no slice ", key.index()));
  }
  const int i = slices[key.index()];
  const SliceInfo& info = partition_.slices()[i];
  const uint64_t elements = partition_.tensor_elements(t);
  if (key.begin() > elements || key.count() > elements - key.begin()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "slice ", SliceName(key), " range [", key.begin(), ", +", key.count(),
        ") is out of bounds for a tensor of ", elements, " elements"));
  }
  if (key.begin() != info.begin || key.count() != info.count) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice ", SliceName(key), " is elements [", info.begin,
                     ", ", info.begin + info.count, ") but the request says [",
                     key.begin(), ", ", key.begin() + key.count(),
                     "); client and server disagree about the partition"));
  }
  if (info.shard != shard_) {
    return absl::NotFoundError(absl::StrCat("slice ", SliceName(key),
                                            " lives on shard ", info.shard,
                                            ", not on shard ", shard_));
  }
  return i;
}

namespace {

// An uncompressed slice's payload: a dtype this server reads, and as many
// bytes as the slice's elements need in it.
absl::Status CheckPlain(const v1::SliceData& g, const SliceInfo& info,
                        absl::string_view what, bool compressed) {
  if (!IsWireDtype(g.dtype())) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " for slice ", SliceName(g.key()), " has ", DTypeName(g.dtype()),
        "; this server accepts DTYPE_F32, DTYPE_BF16, DTYPE_F16",
        compressed ? " and, compressed, DTYPE_TOPK, DTYPE_ONEBIT" : ""));
  }
  const uint64_t want = info.count * DTypeSize(g.dtype());
  if (g.data().size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " for slice ", SliceName(g.key()), " has ",
                     g.data().size(), " bytes; ", info.count, " ",
                     DTypeName(g.dtype()), " elements need ", want));
  }
  return absl::OkStatus();
}

// The values of a slice that carries data, checked in this order: its
// payload (compressed, or plain), its version. An f32 payload is read
// where it lies; any other is decoded into a new entry of `converted`.
absl::StatusOr<absl::Span<const float>> SliceValues(
    const v1::SliceData& g, const SliceInfo& info, absl::string_view what,
    bool compressed, bool packed, std::deque<std::vector<float>>* converted) {
  absl::Span<const float> v;
  if (packed) {
    converted->emplace_back(info.count);
    std::vector<float>& c = converted->back();
    absl::Status valid =
        DecodeCompressed(g.dtype(), g.data(), absl::MakeSpan(c));
    if (!valid.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " for slice ", SliceName(g.key()), ": ", valid.message()));
    }
    v = c;
  } else {
    RETURN_IF_ERROR(CheckPlain(g, info, what, compressed));
  }
  if (g.version() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " for slice ", SliceName(g.key()),
                     " has negative version ", g.version()));
  }
  const auto address = reinterpret_cast<uintptr_t>(g.data().data());
  if (!packed && g.dtype() == v1::DTYPE_F32 && address % alignof(float) == 0) {
    // The payload's own bytes, read as floats: no copy. (The buffer is
    // only ever written as bytes, by the parser or recv.)
    v = absl::MakeConstSpan(reinterpret_cast<const float*>(g.data().data()),
                            info.count);
  } else if (!packed) {
    converted->emplace_back(info.count);
    std::vector<float>& c = converted->back();
    DecodeTensor(g.dtype(), g.data(), absl::MakeSpan(c));
    v = c;
  }
  return v;
}

}  // namespace

absl::Status ShardModel::Decode(
    const google::protobuf::RepeatedPtrField<v1::SliceData>& data,
    absl::string_view what, DecodedPayloads* out, bool compressed) const {
  out->indices.clear();
  out->values.clear();
  out->converted.clear();
  absl::flat_hash_set<int> seen;
  for (int k = 0; k < data.size(); ++k) {
    const v1::SliceData& g = data.Get(k);
    ASSIGN_OR_RETURN(const int i, Resolve(g.key()));
    if (!seen.insert(i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", SliceName(g.key()), " appears twice in one request"));
    }
    const SliceInfo& info = partition_.slices()[i];
    if (g.no_gradient()) {
      // Only a gradient may be absent, and then it carries nothing.
      if (!compressed || !g.data().empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " for slice ", SliceName(g.key()), " says no_gradient but ",
            compressed ? "carries data" : "only a push may say it"));
      }
      out->indices.push_back(i);
      out->values.emplace_back();
      continue;
    }
    const bool packed = compressed && IsCompressedDtype(g.dtype());
    if (packed && spec_.tensors(info.tensor).buffer()) {
      // A buffer's push is its value: top-k or one-bit would corrupt it.
      return absl::InvalidArgumentError(absl::StrCat(
          what, " for slice ", SliceName(g.key()), " is ", DTypeName(g.dtype()),
          ", but '", spec_.tensors(info.tensor).name(),
          "' is a buffer (a value, not a gradient): it travels uncompressed"));
    }
    ASSIGN_OR_RETURN(
        const absl::Span<const float> v,
        SliceValues(g, info, what, compressed, packed, &out->converted));
    const int64_t bad = FirstNonFinite(v);
    if (bad >= 0) {
      return NonFiniteError(absl::StrCat(what, " for slice ",
                                         SliceName(g.key()), " has ",
                                         std::isnan(v[bad]) ? "NaN" : "Inf",
                                         " at element ", info.begin + bad));
    }
    out->indices.push_back(i);
    out->values.push_back(v);
  }
  return absl::OkStatus();
}

}  // namespace asyncps
