#include "server/shard_store.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/initializer.h"
#include "common/model_spec.h"
#include "common/status.h"
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

ShardStore::ShardStore(int shard, int num_shards, uint64_t max_response_bytes,
                       uint64_t max_shard_bytes)
    : shard_(shard),
      num_shards_(num_shards),
      max_response_bytes_(max_response_bytes),
      max_shard_bytes_(max_shard_bytes),
      staleness_(kStalenessBuckets) {}

std::shared_ptr<const ShardStore::Model> ShardStore::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::Status ShardStore::Reject(absl::Status status) {
  rejected_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

absl::Status ShardStore::CheckSpec(const v1::ModelSpec& spec) const {
  absl::Status valid = ValidateModelSpec(spec);
  if (!valid.ok()) return valid;
  if (static_cast<int>(spec.num_shards()) != num_shards_) {
    return absl::FailedPreconditionError(
        absl::StrCat("model spec says num_shards = ", spec.num_shards(),
                     " but this server runs with --num_shards=", num_shards_));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<ShardStore::Model>> ShardStore::BuildModel(
    const v1::ModelSpec& spec) const {
  absl::Status valid = CheckSpec(spec);
  if (!valid.ok()) return valid;
  auto partition = Partition::Create(spec);
  if (!partition.ok()) return partition.status();
  const uint64_t mine = partition->ShardBytes()[shard_];
  if (mine > max_shard_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this model puts ", mine, " bytes of weights on shard ",
                     shard_, ", over its --max_shard_bytes=", max_shard_bytes_,
                     "; use more shards or raise the limit"));
  }
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
  return m;
}

absl::StatusOr<v1::DeclareModelResponse> ShardStore::Declare(
    const v1::ModelSpec& spec) {
  absl::MutexLock lock(&mu_);
  v1::DeclareModelResponse response;
  response.set_shard(shard_);
  if (model_ != nullptr) {
    absl::Status valid = CheckSpec(spec);
    if (!valid.ok()) return Reject(valid);
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
  auto m = BuildModel(spec);
  if (!m.ok()) return Reject(m.status());
  model_ = *m;
  response.set_num_slices(model_->num_slices);
  response.set_num_bytes(model_->num_bytes);
  response.set_created(true);
  return response;
}

absl::StatusOr<v1::ShardCheckpoint> ShardStore::Snapshot() const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return absl::FailedPreconditionError("no model to checkpoint");
  }
  v1::ShardCheckpoint c;
  *c.mutable_spec() = m->spec;
  c.set_shard(shard_);
  for (size_t i = 0; i < m->slices.size(); ++i) {
    if (m->slices[i] == nullptr) continue;
    SliceState& state = *m->slices[i];
    v1::SliceCheckpoint* out = c.add_slices();
    out->set_slice(static_cast<uint32_t>(i));
    absl::MutexLock lock(&state.mu);
    EncodeF32(state.weights, out->mutable_weights());
    EncodeF32(state.slots.slot1(), out->mutable_slot1());
    EncodeF32(state.slots.slot2(), out->mutable_slot2());
    out->set_version(state.version);
    out->set_optimizer_steps(state.slots.steps());
    out->set_applied_step(state.applied_step);
  }
  return c;
}

absl::Status ShardStore::Restore(const v1::ShardCheckpoint& checkpoint) {
  if (static_cast<int>(checkpoint.shard()) != shard_) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint is of shard ", checkpoint.shard(),
                     ", this is shard ", shard_));
  }
  auto built = BuildModel(checkpoint.spec());
  if (!built.ok()) return Annotate(built.status(), "checkpoint");
  std::shared_ptr<Model> m = *std::move(built);
  if (static_cast<uint32_t>(checkpoint.slices_size()) != m->num_slices) {
    return absl::DataLossError(
        absl::StrCat("checkpoint has ", checkpoint.slices_size(),
                     " slices; the model puts ", m->num_slices, " here"));
  }
  for (const v1::SliceCheckpoint& sc : checkpoint.slices()) {
    if (sc.slice() >= m->slices.size() || m->slices[sc.slice()] == nullptr) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint has slice ", sc.slice(), " which is not on this shard"));
    }
    SliceState& state = *m->slices[sc.slice()];
    absl::MutexLock lock(&state.mu);
    auto decode = [](const std::string& bytes, std::vector<float>* out) {
      if (bytes.size() % 4 != 0) return false;
      out->resize(bytes.size() / 4);
      DecodeF32(bytes, absl::MakeSpan(*out));
      return true;
    };
    std::vector<float> w, s1, s2;
    if (!decode(sc.weights(), &w) || w.size() != state.weights.size() ||
        !decode(sc.slot1(), &s1) || !decode(sc.slot2(), &s2) ||
        !state.slots.Restore(std::move(s1), std::move(s2),
                             sc.optimizer_steps()) ||
        sc.version() < 0 || sc.applied_step() < 0) {
      return absl::DataLossError(absl::StrCat("checkpoint slice ", sc.slice(),
                                              " does not fit the model"));
    }
    state.weights = std::move(w);
    state.version = sc.version();
    state.applied_step = sc.applied_step();
  }
  absl::MutexLock lock(&mu_);
  if (model_ != nullptr) {
    return absl::FailedPreconditionError(
        "a model is already declared; restore before serving");
  }
  model_ = std::move(m);
  return absl::OkStatus();
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

absl::StatusOr<std::vector<int>> ShardStore::ResolvePull(
    const v1::PullRequest& request) {
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
  return indices;
}

void ShardStore::FinishPull(const v1::PullRequest& request,
                            const std::vector<int>& slices,
                            v1::PullResponse* response) {
  std::shared_ptr<const Model> m = model();
  response->clear_slices();
  for (size_t k = 0; k < slices.size(); ++k) {
    SliceState& state = *m->slices[slices[k]];
    v1::SliceData* out = response->add_slices();
    *out->mutable_key() = request.slices(static_cast<int>(k));
    out->set_dtype(v1::DTYPE_F32);
    absl::MutexLock lock(&state.mu);
    EncodeF32(state.weights, out->mutable_data());
    out->set_version(state.version);
  }
  pulls_.fetch_add(1, std::memory_order_relaxed);
}

absl::Status ShardStore::Pull(const v1::PullRequest& request,
                              v1::PullResponse* response) {
  auto slices = ResolvePull(request);
  if (!slices.ok()) return slices.status();
  FinishPull(request, *slices, response);
  return absl::OkStatus();
}

absl::Status ShardStore::ValidatePayloads(
    const Model& model,
    const google::protobuf::RepeatedPtrField<v1::SliceData>& data,
    absl::string_view what, std::vector<int>* indices,
    std::vector<std::vector<float>>* values) const {
  indices->clear();
  values->assign(data.size(), {});
  absl::flat_hash_set<int> seen;
  for (int k = 0; k < data.size(); ++k) {
    const v1::SliceData& g = data.Get(k);
    auto i = Resolve(model, g.key());
    if (!i.ok()) return i.status();
    if (!seen.insert(*i).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "slice ", SliceName(g.key()), " appears twice in one request"));
    }
    if (g.dtype() != v1::DTYPE_F32) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " for slice ", SliceName(g.key()), " has ",
          DTypeName(g.dtype()), "; this server accepts DTYPE_F32"));
    }
    const SliceInfo& info = model.partition.slices()[*i];
    if (g.data().size() != info.count * 4) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, " for slice ", SliceName(g.key()), " has ", g.data().size(),
          " bytes; ", info.count, " f32 elements need ", info.count * 4));
    }
    if (g.version() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, " for slice ", SliceName(g.key()),
                       " has negative version ", g.version()));
    }
    std::vector<float>& v = (*values)[k];
    v.resize(info.count);
    DecodeF32(g.data(), absl::MakeSpan(v));
    for (size_t e = 0; e < v.size(); ++e) {
      if (!std::isfinite(v[e])) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " for slice ", SliceName(g.key()), " has ",
            std::isnan(v[e]) ? "NaN" : "Inf", " at element ", info.begin + e));
      }
    }
    indices->push_back(*i);
  }
  return absl::OkStatus();
}

absl::Status ShardStore::Push(const v1::PushRequest& request,
                              const PushPolicy& policy,
                              v1::PushResponse* response) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "push before any model was declared on this shard"));
  }
  // Validate everything before touching any weight.
  std::vector<int> indices;
  std::vector<std::vector<float>> grads;
  absl::Status valid =
      ValidatePayloads(*m, request.gradients(), "gradient", &indices, &grads);
  if (!valid.ok()) return Reject(valid);
  const bool bsp = policy.mode == Mode::kBsp;
  if (bsp && request.rank() < 0) {
    return Reject(absl::InvalidArgumentError(
        "bsp push without a rank; steps count one gradient per rank"));
  }
  if (bsp && request.clock() < 1) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        "bsp push with clock ", request.clock(), "; steps count from 1")));
  }
  // Versions and applied steps only grow, so what passes here still holds
  // at apply time.
  for (int k = 0; k < request.gradients_size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    absl::MutexLock lock(&state.mu);
    if (request.gradients(k).version() > state.version) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          "gradient for slice ", SliceName(request.gradients(k).key()),
          " claims version ", request.gradients(k).version(),
          " but the slice is only at version ", state.version)));
    }
    if (bsp && request.clock() > state.applied_step + 1) {
      return Reject(absl::FailedPreconditionError(absl::StrCat(
          "bsp step ", request.clock(), " for slice ",
          SliceName(request.gradients(k).key()), " pushed before step ",
          state.applied_step + 1, " was applied")));
    }
  }
  response->clear_versions();
  response->clear_staleness();
  response->clear_dropped();
  for (int k = 0; k < request.gradients_size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    int64_t staleness, version;
    bool dropped = false;
    {
      absl::MutexLock lock(&state.mu);
      staleness = state.version - request.gradients(k).version();
      if (bsp) {
        const bool duplicate =
            std::find(state.step_ranks.begin(), state.step_ranks.end(),
                      request.rank()) != state.step_ranks.end();
        if (request.clock() <= state.applied_step || duplicate) {
          dropped = true;
          dropped_late_.fetch_add(1, std::memory_order_relaxed);
        } else {
          if (state.step_ranks.empty()) {
            state.step_sum.assign(grads[k].size(), 0.0f);
            state.step_first = policy.now;
          }
          for (size_t e = 0; e < grads[k].size(); ++e) {
            state.step_sum[e] += grads[k][e];
          }
          state.step_ranks.push_back(request.rank());
          if (static_cast<int>(state.step_ranks.size()) >= policy.quorum) {
            ApplyStep(*m, state, policy.live_workers);
          } else {
            absl::MutexLock pending(&pending_mu_);
            pending_.insert(indices[k]);
          }
        }
      } else if (policy.stale.kind == StalePolicy::kDrop &&
                 staleness > policy.stale.max_staleness) {
        dropped = true;
        dropped_stale_.fetch_add(1, std::memory_order_relaxed);
      } else {
        const float scale = policy.stale.kind == StalePolicy::kScale
                                ? 1.0f / (1.0f + static_cast<float>(staleness))
                                : 1.0f;
        state.slots.Apply(m->spec.optimizer(), scale, grads[k],
                          absl::MakeSpan(state.weights));
        ++state.version;
        updates_applied_.fetch_add(1, std::memory_order_relaxed);
      }
      version = state.version;
    }
    response->add_versions(version);
    response->add_staleness(staleness);
    response->add_dropped(dropped);
    if (!bsp) {
      const int bucket =
          static_cast<int>(std::min<int64_t>(staleness, kStalenessBuckets - 1));
      staleness_[bucket].fetch_add(1, std::memory_order_relaxed);
    }
  }
  pushes_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

void ShardStore::ApplyStep(const Model& model, SliceState& state,
                           int live_workers) {
  const size_t n = state.step_ranks.size();
  const float inv = 1.0f / static_cast<float>(n);
  for (float& g : state.step_sum) g *= inv;
  state.slots.Apply(model.spec.optimizer(), 1.0f, state.step_sum,
                    absl::MakeSpan(state.weights));
  ++state.version;
  ++state.applied_step;
  state.step_ranks.clear();
  updates_applied_.fetch_add(1, std::memory_order_relaxed);
  steps_applied_.fetch_add(1, std::memory_order_relaxed);
  if (static_cast<int>(n) < live_workers) {
    steps_short_.fetch_add(1, std::memory_order_relaxed);
  }
  const int bucket = 0;  // A bsp step is computed from the current weights.
  staleness_[bucket].fetch_add(1, std::memory_order_relaxed);
}

int ShardStore::CompletePendingSteps(int quorum, int live_workers,
                                     absl::Duration deadline, absl::Time now) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return 0;
  std::vector<int> pending;
  {
    absl::MutexLock lock(&pending_mu_);
    pending.assign(pending_.begin(), pending_.end());
  }
  int applied = 0;
  for (int i : pending) {
    SliceState& state = *m->slices[i];
    bool done;
    {
      absl::MutexLock lock(&state.mu);
      if (!state.step_ranks.empty() &&
          (static_cast<int>(state.step_ranks.size()) >= quorum ||
           (deadline > absl::ZeroDuration() &&
            now - state.step_first >= deadline))) {
        ApplyStep(*m, state, live_workers);
        ++applied;
      }
      done = state.step_ranks.empty();
    }
    if (done) {
      absl::MutexLock lock(&pending_mu_);
      pending_.erase(i);
    }
  }
  return applied;
}

bool ShardStore::StepApplied(const std::vector<int>& slices,
                             int64_t clock) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return true;
  for (int i : slices) {
    SliceState& state = *m->slices[i];
    absl::MutexLock lock(&state.mu);
    if (state.applied_step < clock) return false;
  }
  return true;
}

absl::Status ShardStore::Assign(const v1::AssignRequest& request) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "assign before any model was declared on this shard"));
  }
  std::vector<int> indices;
  std::vector<std::vector<float>> values;
  absl::Status valid =
      ValidatePayloads(*m, request.weights(), "weights", &indices, &values);
  if (!valid.ok()) return Reject(valid);
  for (int k = 0; k < request.weights_size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    absl::MutexLock lock(&state.mu);
    state.weights = std::move(values[k]);
    state.version = request.weights(k).version();
  }
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
  c.dropped_stale = dropped_stale_.load(std::memory_order_relaxed);
  c.dropped_late = dropped_late_.load(std::memory_order_relaxed);
  c.steps_applied = steps_applied_.load(std::memory_order_relaxed);
  c.steps_short = steps_short_.load(std::memory_order_relaxed);
  for (const auto& b : staleness_) {
    c.staleness_histogram.push_back(b.load(std::memory_order_relaxed));
  }
  return c;
}

}  // namespace asyncps
