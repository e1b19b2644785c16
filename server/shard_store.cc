#include "server/shard_store.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/initializer.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"

namespace asyncps {
namespace {

v1::DType PullDtype(const v1::PullRequest& request) {
  return request.dtype() == v1::DTYPE_UNSPECIFIED ? v1::DTYPE_F32
                                                  : request.dtype();
}

// A push's fields that only bsp reads: a bsp push names its rank and its
// step (from 1); only a bsp push may say a slice has no gradient.
absl::Status CheckModeFields(const v1::PushRequest& request, Mode mode) {
  const bool bsp = mode == Mode::kBsp;
  if (bsp && request.rank() < 0) {
    return absl::InvalidArgumentError(
        "bsp push without a rank; steps count one gradient per rank");
  }
  if (bsp && request.clock() < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bsp push with clock ", request.clock(), "; steps count from 1"));
  }
  for (const v1::SliceData& g : request.gradients()) {
    if (g.no_gradient() && !bsp) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient for slice ", SliceName(g.key()),
                       " says no_gradient, which only a bsp push may (in ",
                       ModeName(mode), " a rank just does not push it)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

ShardStore::ShardStore(int shard, int num_shards, uint64_t max_response_bytes,
                       uint64_t max_shard_bytes, uint64_t incarnation)
    : shard_(shard),
      num_shards_(num_shards),
      max_response_bytes_(max_response_bytes),
      max_shard_bytes_(max_shard_bytes),
      incarnation_(incarnation) {}

std::shared_ptr<const ShardStore::Model> ShardStore::model() const {
  absl::MutexLock lock(&mu_);
  return model_;
}

absl::Status ShardStore::Reject(absl::Status status) {
  counters_.Add(ShardCounter::kRejected);
  return status;
}

absl::StatusOr<std::shared_ptr<ShardStore::Model>> ShardStore::BuildModel(
    const v1::ModelSpec& spec) const {
  auto m = std::make_shared<Model>();
  ASSIGN_OR_RETURN(m->model, ShardModel::Create(spec, shard_, num_shards_,
                                                max_shard_bytes_));
  const Partition& partition = m->model->partition();
  m->slices.resize(partition.slices().size());
  for (int i : m->model->local_slices()) {
    const SliceInfo& info = partition.slices()[i];
    const v1::TensorSpec& tensor = spec.tensors(info.tensor);
    auto state = std::make_unique<SliceState>(spec.optimizer(), info.count,
                                              tensor.buffer());
    state->Initialize([&](absl::Span<float> weights) {
      FillInitial(tensor.init(), spec.seed(), tensor.name(), info.begin,
                  weights);
    });
    m->slices[i] = std::move(state);
  }
  return m;
}

absl::StatusOr<v1::DeclareModelResponse> ShardStore::Declare(
    const v1::ModelSpec& spec) {
  absl::MutexLock lock(&mu_);
  v1::DeclareModelResponse response;
  response.set_shard(shard_);
  if (model_ != nullptr) {
    absl::Status valid = ShardModel::CheckSpec(spec, num_shards_);
    if (!valid.ok()) return Reject(valid);
    const std::string diff =
        DescribeSpecDifference(model_->model->spec(), spec);
    if (!diff.empty()) {
      return Reject(absl::FailedPreconditionError(
          absl::StrCat("a different model is already declared on shard ",
                       shard_, ": ", diff)));
    }
    response.set_created(false);
  } else {
    auto m = BuildModel(spec);
    if (!m.ok()) return Reject(m.status());
    model_ = *std::move(m);
    response.set_created(true);
  }
  response.set_incarnation(incarnation_);
  response.set_num_slices(model_->model->num_slices());
  response.set_num_bytes(model_->model->num_bytes());
  return response;
}

absl::StatusOr<std::vector<int>> ShardStore::ResolvePull(
    const v1::PullRequest& request) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) {
    return Reject(absl::FailedPreconditionError(
        "pull before any model was declared on this shard"));
  }
  if (request.dtype() != v1::DTYPE_UNSPECIFIED &&
      !IsWireDtype(request.dtype())) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        "pull asks for weights in ", DTypeName(request.dtype()),
        "; this server answers DTYPE_F32, DTYPE_BF16, DTYPE_F16")));
  }
  const size_t element = DTypeSize(PullDtype(request));
  std::vector<int> indices;
  indices.reserve(request.slices_size());
  uint64_t bytes = 0;
  for (const v1::SliceKey& key : request.slices()) {
    auto i = m->model->Resolve(key);
    if (!i.ok()) return Reject(i.status());
    indices.push_back(*i);
    bytes += m->model->partition().slices()[*i].count * element;
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
    v1::SliceData* out = response->add_slices();
    *out->mutable_key() = request.slices(static_cast<int>(k));
    out->set_dtype(PullDtype(request));
    out->set_incarnation(incarnation_);
    out->set_version(
        m->slices[slices[k]]->Read(PullDtype(request), out->mutable_data()));
    if (request.with_state()) {
      out->set_optimizer_steps(m->slices[slices[k]]->ReadState(
          out->mutable_slot1(), out->mutable_slot2()));
    }
  }
  counters_.Add(ShardCounter::kPulls);
}

absl::Status ShardStore::Pull(const v1::PullRequest& request,
                              v1::PullResponse* response) {
  ASSIGN_OR_RETURN(const std::vector<int> slices, ResolvePull(request));
  FinishPull(request, slices, response);
  return absl::OkStatus();
}

bool ShardStore::Restarted(const v1::SliceData& g) const {
  return g.incarnation() != 0 && g.incarnation() != incarnation_;
}

absl::Status ShardStore::CheckPush(const Model& m,
                                   const v1::PushRequest& request,
                                   const std::vector<int>& indices, bool bsp,
                                   int quorum) {
  const v1::OptimizerSpec& optimizer = m.model->spec().optimizer();
  for (int k = 0; k < request.gradients_size(); ++k) {
    const v1::SliceData& g = request.gradients(k);
    if (!g.has_optimizer()) continue;
    if (g.optimizer().kind() != optimizer.kind()) {
      return Reject(absl::InvalidArgumentError(
          absl::StrCat("gradient for slice ", SliceName(g.key()),
                       " asks for optimizer kind ",
                       v1::OptimizerSpec::Kind_Name(g.optimizer().kind()),
                       "; the model was declared with ",
                       v1::OptimizerSpec::Kind_Name(optimizer.kind()))));
    }
    absl::Status valid = ValidateOptimizer(g.optimizer());
    if (!valid.ok()) {
      return Reject(Annotate(
          valid, absl::StrCat("gradient for slice ", SliceName(g.key()))));
    }
  }
  for (int k = 0; k < request.gradients_size(); ++k) {
    const v1::SliceData& g = request.gradients(k);
    if (Restarted(g)) continue;
    absl::Status ok = m.slices[indices[k]]->CheckPush(
        g.version(), bsp, request.clock(), request.rank(), quorum,
        SliceName(g.key()));
    if (!ok.ok()) return Reject(ok);
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
  DecodedPayloads decoded;
  absl::Status valid =
      m->model->Decode(request.gradients(), "gradient", &decoded,
                       /*compressed=*/true);
  if (!valid.ok()) return Reject(valid);
  const std::vector<int>& indices = decoded.indices;
  const std::vector<absl::Span<const float>>& grads = decoded.values;
  const bool bsp = policy.mode == Mode::kBsp;
  if (absl::Status fits = CheckModeFields(request, policy.mode); !fits.ok()) {
    return Reject(fits);
  }
  RETURN_IF_ERROR(CheckPush(*m, request, indices, bsp, policy.quorum));
  const v1::OptimizerSpec& optimizer = m->model->spec().optimizer();
  response->clear_versions();
  response->clear_staleness();
  response->clear_dropped();
  response->set_incarnation(incarnation_);
  int64_t front = 0;
  bool caught_up = false;
  for (int k = 0; k < request.gradients_size(); ++k) {
    SliceState& state = *m->slices[indices[k]];
    const bool lost = Restarted(request.gradients(k));
    if (lost && !bsp) {
      counters_.Add(ShardCounter::kDroppedRestarted);
      response->add_versions(state.version());
      response->add_staleness(0);
      response->add_dropped(true);
      continue;
    }
    // The pusher completed step clock - 1 on every slice before this shard
    // restarted: the whole shard catches up to it, not just these slices
    // (a slice left behind would hold every later pull of that step).
    if (lost && !caught_up) {
      FastForwardTo(request.clock() - 1, policy.quorum,
                    /*discard_pending=*/true);
      caught_up = true;
    }
    const int64_t version =
        lost ? state.version() : request.gradients(k).version();
    const v1::OptimizerSpec& hyper = request.gradients(k).has_optimizer()
                                         ? request.gradients(k).optimizer()
                                         : optimizer;
    const SliceOutcome o =
        bsp ? state.AddToStep(hyper, request.rank(), request.clock(), version,
                              grads[k], policy.quorum, policy.live_workers,
                              policy.now)
            : state.ApplyAsync(hyper, policy.stale, version, grads[k],
                               policy.live_workers);
    if (bsp) front = std::max(front, state.applied_step());
    if (o.step_pending) {
      absl::MutexLock pending(&pending_mu_);
      pending_.insert(indices[k]);
    }
    counters_.Count(o, bsp);
    response->add_versions(o.version);
    response->add_staleness(o.staleness);
    response->add_dropped(o.dropped);
  }
  if (bsp) response->set_front_step(front);
  counters_.Add(ShardCounter::kPushes);
  return absl::OkStatus();
}

std::vector<int> ShardStore::PendingSlices() const {
  absl::MutexLock lock(&pending_mu_);
  return std::vector<int>(pending_.begin(), pending_.end());
}

void ShardStore::NotPending(int slice) {
  absl::MutexLock lock(&pending_mu_);
  pending_.erase(slice);
}

int ShardStore::CompletePendingSteps(int quorum, int live_workers,
                                     absl::Duration deadline, absl::Time now) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return 0;
  const std::vector<int> pending = PendingSlices();
  int applied = 0;
  for (int i : pending) {
    const SliceOutcome o = m->slices[i]->CompleteStep(
        m->model->spec().optimizer(), quorum, live_workers, deadline, now);
    counters_.Count(o, /*bsp=*/true);
    applied += o.step_applied;
    if (!o.step_pending) NotPending(i);
  }
  return applied;
}

int ShardStore::FastForwardTo(int64_t step, int quorum, bool discard_pending) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return 0;
  int moved = 0;
  for (int i : m->model->local_slices()) {
    SliceOutcome applied;
    moved += m->slices[i]->FastForward(m->model->spec().optimizer(), step,
                                       discard_pending, quorum, &applied);
    if (applied.step_applied) {
      counters_.Count(applied, /*bsp=*/true);
      NotPending(i);
    }
  }
  return moved;
}

bool ShardStore::LacksGradient(const std::vector<int>& slices, int rank,
                               int64_t clock) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return false;
  for (int i : slices) {
    if (m->slices[i]->LacksGradient(rank, clock)) return true;
  }
  return false;
}

int ShardStore::HealPendingSteps(const std::vector<int>& live_ranks,
                                 const NotSending& not_sending,
                                 absl::Duration bound, absl::Time now,
                                 std::vector<std::string>* healed) {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return 0;
  const std::vector<int> pending = PendingSlices();
  int applied = 0;
  std::vector<int> left_out;
  for (int i : pending) {
    SliceState& state = *m->slices[i];
    const int64_t step = state.applied_step() + 1;
    const SliceOutcome o = state.Heal(m->model->spec().optimizer(), live_ranks,
                                      not_sending, bound, now, &left_out);
    if (!o.step_applied) continue;
    counters_.Count(o, /*bsp=*/true);
    ++applied;
    const SliceInfo& info = m->model->partition().slices()[i];
    healed->push_back(absl::StrCat(
        "step ", step, " of '", m->model->spec().tensors(info.tensor).name(),
        "'#", info.index, " without rank(s) ", absl::StrJoin(left_out, ",")));
    if (!o.step_pending) NotPending(i);
  }
  return applied;
}

ShardStore::StepsAdvanced ShardStore::AdvanceSteps(const StepAdvance& a) {
  StepsAdvanced r;
  r.moved = FastForwardTo(a.fast_forward_to, a.quorum);
  r.completed =
      CompletePendingSteps(a.quorum, a.live_workers, a.deadline, a.now);
  if (a.heal) {
    HealPendingSteps(a.live_ranks, a.not_sending, a.heal_after, a.now,
                     &r.healed);
  }
  return r;
}

std::pair<int64_t, int64_t> ShardStore::Progress(bool bsp) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return {0, 0};
  bool any = false;
  int64_t lo = 0, hi = 0;
  for (int i : m->model->local_slices()) {
    const int64_t v =
        bsp ? m->slices[i]->applied_step() : m->slices[i]->version();
    lo = any ? std::min(lo, v) : v;
    hi = any ? std::max(hi, v) : v;
    any = true;
  }
  return {lo, hi};
}

bool ShardStore::StepApplied(const std::vector<int>& slices,
                             int64_t clock) const {
  std::shared_ptr<const Model> m = model();
  if (m == nullptr) return true;
  for (int i : slices) {
    if (!m->slices[i]->StepApplied(clock)) return false;
  }
  return true;
}

absl::StatusOr<v1::ModelSpec> ShardStore::Spec() const {
  auto m = model();
  if (m == nullptr) {
    return absl::FailedPreconditionError(
        "no model has been declared on this shard yet");
  }
  return m->model->spec();
}

bool ShardStore::declared() const { return model() != nullptr; }

uint32_t ShardStore::num_slices() const {
  auto m = model();
  return m == nullptr ? 0 : m->model->num_slices();
}

uint64_t ShardStore::num_bytes() const {
  auto m = model();
  return m == nullptr ? 0 : m->model->num_bytes();
}

std::string ShardStore::model_name() const {
  auto m = model();
  return m == nullptr ? "" : m->model->spec().name();
}

ShardCounters ShardStore::Counters() const { return counters_.Snapshot(); }

}  // namespace asyncps
