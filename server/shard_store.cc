#include "server/shard_store.h"

#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/initializer.h"
#include "common/model_spec.h"
#include "common/tensor_bytes.h"

namespace asyncps {
namespace {

std::string SliceName(const v1::SliceKey& key) {
  return absl::StrCat("'", key.tensor(), "'#", key.index());
}

std::string DTypeName(int dtype) {
  const std::string& name = v1::DType_Name(static_cast<v1::DType>(dtype));
  return name.empty() ? absl::StrCat("unknown dtype ", dtype) : name;
}

}  // namespace

ShardStore::ShardStore(int shard, int num_shards, uint64_t max_response_bytes)
    : shard_(shard),
      num_shards_(num_shards),
      max_response_bytes_(max_response_bytes),
      staleness_(kStalenessBuckets) {}

std::shared_ptr<const ShardStore::Model> ShardStore::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::Status ShardStore::Reject(absl::Status status) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

absl::StatusOr<v1::DeclareModelResponse> ShardStore::Declare(
    const v1::ModelSpec& spec) {
  absl::Status valid = ValidateModelSpec(spec);
  if (!valid.ok()) return Reject(valid);
  if (static_cast<int>(spec.num_shards()) != num_shards_) {
    return Reject(absl::FailedPreconditionError(
        absl::StrCat("model spec says num_shards = ", spec.num_shards(),
                     " but this server runs with --num_shards=", num_shards_)));
  }
  absl::MutexLock lock(&mu_);
  v1::DeclareModelResponse response;
  response.set_shard(shard_);
  if (model_ != nullptr) {
    const std::string diff = DescribeSpecDifference(model_->spec, spec);
    if (!diff.empty()) {
      return Reject(absl::FailedPreconditionError(
          absl::StrCat("a different model is already declared on shard ",
                       shard_, ": ", diff)));
    }
    response.set_num_slices(model_->num_slices);
    response.set_num_bytes(model_->num_bytes);
    response.set_created(false);
    return response;
  }
  auto partition = Partition::Create(spec);
  if (!partition.ok()) return Reject(partition.status());
  auto m = std::make_shared<Model>();
  m->spec = spec;
  m->partition = *std::move(partition);
  for (int t = 0; t < spec.tensors_size(); ++t) {
    m->tensor_index[spec.tensors(t).name()] = t;
  }
  m->slices.resize(m->partition.slices().size());
  for (size_t i = 0; i < m->slices.size(); ++i) {
    const SliceInfo& info = m->partition.slices()[i];
    if (info.shard != shard_) continue;
    auto state = std::make_unique<SliceState>(spec.optimizer(), info.count);
    const v1::TensorSpec& tensor = spec.tensors(info.tensor);
    {
      absl::MutexLock slice_lock(&state->mu);
      FillInitial(tensor.init(), spec.seed(), tensor.name(), info.begin,
                  absl::MakeSpan(state->weights));
    }
    m->slices[i] = std::move(state);
    ++m->num_slices;
    m->num_bytes += info.count * 4;
  }
  model_ = m;
  response.set_num_slices(m->num_slices);
  response.set_num_bytes(m->num_bytes);
  response.set_created(true);
  return response;
}

absl::StatusOr<int> ShardStore::Resolve(const Model& model,
                                        const v1::SliceKey& key) const {
  auto it = model.tensor_index.find(key.tensor());
  if (it == model.tensor_index.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown tensor '", key.tensor(), "'"));
  }
  const int t = it->second;
  const std::vector<int>& slices = model.partition.tensor_slices(t);
  if (key.index() >= slices.size()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", key.tensor(), "' has ", slices.size(),
                     " slices; there is no slice ", key.index()));
  }
  const int i = slices[key.index()];
  const SliceInfo& info = model.partition.slices()[i];
  const uint64_t elements = model.partition.tensor_elements(t);
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

absl::Status ShardStore::Pull(const v1::PullRequest& request,
                              v1::PullResponse* response) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "pull before any model was declared on this shard"));
  }
  std::vector<int> indices;
  indices.reserve(request.slices_size());
  uint64_t bytes = 0;
  for (const v1::SliceKey& key : request.slices()) {
    auto i = Resolve(*m, key);
    if (!i.ok()) return Reject(i.status());
    indices.push_back(*i);
    bytes += m->partition.slices()[*i].count * 4;
  }
  if (bytes > max_response_bytes_) {
    return Reject(absl::ResourceExhaustedError(absl::StrCat(
        "pull of ", bytes, " bytes exceeds this server's message limit of ",
        max_response_bytes_, " bytes; ask for fewer slices per request")));
  }
  response->clear_slices();
  for (size_t k = 0; k < indices.size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    v1::SliceData* out = response->add_slices();
    *out->mutable_key() = request.slices(k);
    out->set_dtype(v1::DTYPE_F32);
    absl::MutexLock lock(&state.mu);
    EncodeF32(state.weights, out->mutable_data());
    out->set_version(state.version);
  }
  pulls_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status ShardStore::Push(const v1::PushRequest& request,
                              v1::PushResponse* response) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "push before any model was declared on this shard"));
  }
  // Validate everything before touching any weight.
  std::vector<int> indices;
  std::vector<std::vector<float>> grads(request.gradients_size());
  absl::flat_hash_set<int> seen;
  for (int k = 0; k < request.gradients_size(); ++k) {
    const v1::SliceData& g = request.gradients(k);
    auto i = Resolve(*m, g.key());
    if (!i.ok()) return Reject(i.status());
    if (!seen.insert(*i).second) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          "slice ", SliceName(g.key()), " appears twice in one push")));
    }
    if (g.dtype() != v1::DTYPE_F32) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          "gradient for slice ", SliceName(g.key()), " has ",
          DTypeName(g.dtype()), "; this server accepts DTYPE_F32")));
    }
    const SliceInfo& info = m->partition.slices()[*i];
    if (g.data().size() != info.count * 4) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          "gradient for slice ", SliceName(g.key()), " has ", g.data().size(),
          " bytes; ", info.count, " f32 elements need ", info.count * 4)));
    }
    if (g.version() < 0) {
      return Reject(absl::InvalidArgumentError(
          absl::StrCat("gradient for slice ", SliceName(g.key()),
                       " has negative version ", g.version())));
    }
    grads[k].resize(info.count);
    DecodeF32(g.data(), absl::MakeSpan(grads[k]));
    for (size_t e = 0; e < grads[k].size(); ++e) {
      if (!std::isfinite(grads[k][e])) {
        return Reject(absl::InvalidArgumentError(
            absl::StrCat("gradient for slice ", SliceName(g.key()), " has ",
                         std::isnan(grads[k][e]) ? "NaN" : "Inf",
                         " at element ", info.begin + e)));
      }
    }
    indices.push_back(*i);
  }
  // Versions only grow, so one that is not ahead now will not be ahead at
  // apply time either.
  for (int k = 0; k < request.gradients_size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    absl::MutexLock lock(&state.mu);
    if (request.gradients(k).version() > state.version) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          "gradient for slice ", SliceName(request.gradients(k).key()),
          " claims version ", request.gradients(k).version(),
          " but the slice is only at version ", state.version)));
    }
  }
  response->clear_versions();
  response->clear_staleness();
  for (int k = 0; k < request.gradients_size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    int64_t staleness, version;
    {
      absl::MutexLock lock(&state.mu);
      staleness = state.version - request.gradients(k).version();
      state.slots.Apply(m->spec.optimizer(), 1.0f, grads[k],
                        absl::MakeSpan(state.weights));
      version = ++state.version;
    }
    response->add_versions(version);
    response->add_staleness(staleness);
    const int bucket =
        static_cast<int>(std::min<int64_t>(staleness, kStalenessBuckets - 1));
    staleness_[bucket].fetch_add(1, std::memory_order_relaxed);
  }
  updates_applied_.fetch_add(request.gradients_size(),
                             std::memory_order_relaxed);
  pushes_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<v1::ModelSpec> ShardStore::Spec() const {
  auto m = model();
  if (m == nullptr) {
    return absl::FailedPreconditionError(
        "no model has been declared on this shard yet");
  }
  return m->spec;
}

bool ShardStore::declared() const { return model() != nullptr; }

uint32_t ShardStore::num_slices() const {
  auto m = model();
  return m == nullptr ? 0 : m->num_slices;
}

uint64_t ShardStore::num_bytes() const {
  auto m = model();
  return m == nullptr ? 0 : m->num_bytes;
}

std::string ShardStore::model_name() const {
  auto m = model();
  return m == nullptr ? "" : m->spec.name();
}

ShardCounters ShardStore::Counters() const {
  ShardCounters c;
  c.updates_applied = updates_applied_.load(std::memory_order_relaxed);
  c.pushes = pushes_.load(std::memory_order_relaxed);
  c.pulls = pulls_.load(std::memory_order_relaxed);
  c.rejected = rejected_.load(std::memory_order_relaxed);
  for (const auto& b : staleness_) {
    c.staleness_histogram.push_back(b.load(std::memory_order_relaxed));
  }
  return c;
}

}  // namespace asyncps
