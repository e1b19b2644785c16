// Client::Impl's calls (client/client_impl.h).
#include "client/client_impl.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_spec.h"
#include "common/optimizer.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace asyncps {

// True if no element is NaN or infinite. On the hot path of every push (about a
// third of a plain isfinite loop's time here): the exponent bits of 8 elements
// at a time, with no branch, which the compiler turns into vector code at -O2.
// An exponent of all ones (NaN or Inf) carries into bit 31. The element is
// looked for only once one is found.
bool AllFinite(absl::Span<const float> values) {
  constexpr uint32_t kExponent = 0x7f800000u;
  constexpr uint32_t kCarry = 0x00800000u;
  uint32_t lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t n = values.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint32_t bits[8];
    std::memcpy(bits, values.data() + i, sizeof(bits));
    for (int j = 0; j < 8; ++j) lanes[j] |= (bits[j] & kExponent) + kCarry;
  }
  uint32_t any = 0;
  for (; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values.data() + i, sizeof(bits));
    any |= (bits & kExponent) + kCarry;
  }
  for (uint32_t lane : lanes) any |= lane;
  return (any & 0x80000000u) == 0;
}

// INVALID_ARGUMENT at the first NaN or infinity of any gradient. Checked
// before anything is sent: each shard refuses such a gradient itself, but
// a push spans shards, and the others would apply their part.
absl::Status CheckFinite(const std::vector<std::string>& names,
                         const std::vector<absl::Span<const float>>& grads) {
  for (size_t k = 0; k < grads.size(); ++k) {
    if (AllFinite(grads[k])) continue;
    for (size_t i = 0; i < grads[k].size(); ++i) {
      if (!std::isfinite(grads[k][i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("gradient of tensor '", names[k], "' has ",
                         std::isnan(grads[k][i]) ? "NaN" : "Inf",
                         " at element ", i, "; nothing was pushed"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::Declare(
    const std::vector<TensorSpec>& tensors,
    const std::vector<absl::Span<const float>>& initial,
    const OptimizerOptions& optimizer, const std::string& model_name) {
  RETURN_IF_ERROR(MustBeWorker("Declare"));
  if (initial.size() != tensors.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Declare: ", tensors.size(), " tensors but ",
                     initial.size(), " initial buffers"));
  }
  v1::ModelSpec spec;
  spec.set_name(model_name);
  ASSIGN_OR_RETURN(*spec.mutable_optimizer(), ToSpec(optimizer));
  spec.set_slice_bytes(static_cast<uint64_t>(slice_bytes_));
  spec.set_num_shards(static_cast<uint32_t>(ps_->num_shards()));
  for (const TensorSpec& t : tensors) {
    v1::TensorSpec* out = spec.add_tensors();
    out->set_name(t.name);
    for (int64_t d : t.shape) out->add_shape(d);
    out->set_dtype(v1::DTYPE_F32);
    out->mutable_init()->set_kind(v1::Initializer::ZEROS);
    out->set_buffer(t.buffer);
  }
  // Each tensor's wire dtype ("": the client's, known once adopted).
  std::vector<v1::DType> wire(tensors.size(), v1::DTYPE_UNSPECIFIED);
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].wire_dtype.empty()) continue;
    absl::StatusOr<v1::DType> d = ParseWireDtype(tensors[t].wire_dtype);
    if (!d.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", tensors[t].name, "': wire dtype '",
                       tensors[t].wire_dtype, "' (want f32, bf16 or f16)"));
    }
    wire[t] = *d;
  }
  return DeclareSpec(spec, initial, std::move(wire));
}

absl::Status Client::Impl::DeclareSpec(
    const v1::ModelSpec& spec,
    const std::vector<absl::Span<const float>>& initial,
    std::vector<v1::DType> wire) {
  RETURN_IF_ERROR(MustBeWorker("Declare"));
  RETURN_IF_ERROR(ValidateModelSpec(spec));
  if (initial.size() != static_cast<size_t>(spec.tensors_size())) {
    return absl::InvalidArgumentError(
        absl::StrCat("Declare: ", spec.tensors_size(), " tensors but ",
                     initial.size(), " initial buffers"));
  }
  wire.resize(spec.tensors_size(), v1::DTYPE_UNSPECIFIED);
  RETURN_IF_ERROR(ps_->DeclareModel(spec, initial, JobTrained()));
  for (size_t t = 0; t < wire.size(); ++t) {
    if (wire[t] == v1::DTYPE_UNSPECIFIED) {
      wire[t] = ps_->WireDtype(static_cast<int>(t));
    }
  }
  RETURN_IF_ERROR(ps_->SetWireDtypes(wire));
  return Adopt();
}

absl::Status Client::Impl::Pull(const TensorSet& set,
                                const std::vector<absl::Span<float>>& out,
                                const CallOptions& options) {
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, out.size()));
  const std::vector<int>& indices = set.indices_;
  TensorViews views(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = out[k];
  std::vector<SliceVersion> own;
  std::vector<SliceVersion>* versions = &own;
  if (options.into != nullptr) {
    versions = &options.into->rep_->versions;
  } else {
    own = Versions();
  }
  versions->resize(ps_->partition().slices().size());
  const int64_t step = options.step >= 0 ? options.step : clock();
  // Not told to the shards, and not forgotten here: a gradient pushed
  // again after a failed pull still says where its weights came from.
  auto any_incarnation = [&](bool after_push) {
    std::vector<SliceVersion> asked = *versions;
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) asked[i].incarnation = 0;
    }
    RETURN_IF_ERROR(
        ps_->Pull(indices, views, &asked, rank(), step, after_push));
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) (*versions)[i] = asked[i];
    }
    return absl::OkStatus();
  };
  absl::Status s = options.any_incarnation
                       ? any_incarnation(options.after_push)
                       : ps_->Pull(indices, views, versions, rank(), step,
                                   options.after_push);
  // bsp: ABORTED asks for this rank's part of the step again (a shard lost
  // it with a restart): SendStepAgain, then the step is pulled as one that
  // follows the rank's own push (so a shard that restarts again asks
  // again). A few times.
  for (int again = 0; again < 3 && mode_ == Mode::kBsp &&
                      s.code() == absl::StatusCode::kAborted;
       ++again) {
    absl::Status sent =
        SendStepAgain(indices, step, *versions, /*kept=*/options.step < 0);
    if (absl::IsNotFound(sent)) break;  // Nothing of the step known here.
    LOG(WARNING) << "step " << step << ": " << s.message()
                 << "; sent this rank's part of the step again";
    s = sent.ok() ? any_incarnation(/*after_push=*/true) : sent;
  }
  RETURN_IF_ERROR(s);
  if (options.into == nullptr) KeepVersions(indices, own);
  return absl::OkStatus();
}

std::vector<int> Client::Impl::NotPushedIn(const std::vector<int>& indices,
                                           int64_t step) {
  absl::MutexLock lock(&step_mu_);
  // EndStep of `step` ran (the clock is past it) and pushed none of these.
  if (clock() < step || pushed_step_ > step) return {};  // Not known.
  std::vector<int> absent;
  for (int t : indices) {
    if (!PushedLocked(t, step)) absent.push_back(t);
  }
  return absent;
}

bool Client::Impl::PushedLocked(int tensor, int64_t step) const {
  return pushed_step_ == step && static_cast<size_t>(tensor) < pushed_.size() &&
         pushed_[tensor];
}

absl::Status Client::Impl::SendStepAgain(const std::vector<int>& indices,
                                         int64_t step,
                                         const std::vector<SliceVersion>& held,
                                         bool kept) {
  bool any = false;
  if (kept) {
    absl::Status pushed = PushKeptAgain(indices, step);
    if (!absl::IsNotFound(pushed)) {
      RETURN_IF_ERROR(pushed);
      any = true;
    }
  }
  // After the gradients: a mark for a tensor that has its gradient there
  // would be dropped, but one that came first would count it as zero.
  const std::vector<int> absent = NotPushedIn(indices, step);
  if (!absent.empty()) {
    RETURN_IF_ERROR(ps_->PushNoGradient(absent, rank(), step, &held));
    any = true;
  }
  if (!any) {
    return absl::NotFoundError(
        absl::StrCat("nothing of step ", step, " known to send again"));
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::Push(
    const TensorSet& set, const std::vector<absl::Span<const float>>& grads,
    const CallOptions& options) {
  RETURN_IF_ERROR(MustBeWorker("Push"));
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, grads.size()));
  const std::vector<int>& indices = set.indices_;
  const std::vector<std::string>& names = set.names_;
  RETURN_IF_ERROR(CheckFinite(names, grads));
  ConstTensorViews views(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = grads[k];
  std::vector<SliceVersion> own;
  const std::vector<SliceVersion>& from = From(options, &own);
  const int64_t step = options.step >= 0 ? options.step : clock() + 1;
  std::vector<v1::OptimizerSpec> specs;
  TensorOptimizers per_tensor;
  RETURN_IF_ERROR(Optimizers(names, indices, options, &specs, &per_tensor));
  MarkPushed(indices, step);
  if (mode_ == Mode::kBsp && options.step < 0 && !options.again) {
    KeepPush(indices, views, from, specs, step);
  }
  PushStats r;
  RETURN_IF_ERROR(ps_->Push(indices, views, from, rank(), step, &r,
                            specs.empty() ? nullptr : &per_tensor,
                            options.again));
  if (options.stats != nullptr) options.stats->Add(r);
  return absl::OkStatus();
}

absl::Status Client::Impl::Optimizers(const std::vector<std::string>& names,
                                      const std::vector<int>& indices,
                                      const CallOptions& options,
                                      std::vector<v1::OptimizerSpec>* specs,
                                      TensorOptimizers* per_tensor) const {
  if (options.optimizers == nullptr) return absl::OkStatus();
  if (options.optimizers->size() != indices.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(indices.size(), " tensors but ",
                     options.optimizers->size(), " optimizers"));
  }
  specs->reserve(indices.size());
  for (size_t k = 0; k < indices.size(); ++k) {
    absl::StatusOr<v1::OptimizerSpec> spec = ToSpec((*options.optimizers)[k]);
    if (!spec.ok()) return Annotate(spec.status(), "tensor '" + names[k] + "'");
    if (spec->kind() != ps_->spec().optimizer().kind()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", names[k], "': optimizer '", (*options.optimizers)[k].kind,
          "' is not the kind the model was declared with"));
    }
    specs->push_back(*std::move(spec));
  }
  per_tensor->assign(NumTensors(), nullptr);
  for (size_t k = 0; k < indices.size(); ++k) {
    (*per_tensor)[indices[k]] = &(*specs)[k];
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::PushPull(
    const TensorSet& set, const std::vector<absl::Span<const float>>& grads,
    const std::vector<absl::Span<float>>& out, const CallOptions& options) {
  RETURN_IF_ERROR(MustBeWorker("PushPull"));
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, grads.size()));
  const std::vector<int>& indices = set.indices_;
  const std::vector<std::string>& names = set.names_;
  if (out.size() != names.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PushPull: ", names.size(), " names but ", out.size(), " outputs"));
  }
  RETURN_IF_ERROR(CheckFinite(names, grads));
  ConstTensorViews in(NumTensors());
  TensorViews views(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) {
    in[indices[k]] = grads[k];
    views[indices[k]] = out[k];
  }
  std::vector<SliceVersion> own;
  const std::vector<SliceVersion>& from = From(options, &own);
  std::vector<SliceVersion> pulled;
  std::vector<SliceVersion>* into = &pulled;
  if (options.into != nullptr) into = &options.into->rep_->versions;
  const int64_t step = options.step >= 0 ? options.step : clock() + 1;
  std::vector<v1::OptimizerSpec> specs;
  TensorOptimizers per_tensor;
  RETURN_IF_ERROR(Optimizers(names, indices, options, &specs, &per_tensor));
  MarkPushed(indices, step);
  PushStats r;
  const TensorOptimizers* hyper = specs.empty() ? nullptr : &per_tensor;
  absl::Status s =
      ps_->PushPull(indices, in, from, rank(), step, views, into, &r, hyper);
  // bsp: ABORTED says a shard's step waits without this rank's gradient
  // (lost on the way): it goes again, as it went (error feedback counts it
  // once), and then the step is pulled, as the per-tensor path does
  // (CallOptions::after_push). A few times: a shard may restart again.
  for (int again = 0; again < 3 && mode_ == Mode::kBsp &&
                      s.code() == absl::StatusCode::kAborted;
       ++again) {
    LOG(WARNING) << "step " << step << ": " << s.message()
                 << "; pushing the step's gradient again";
    s = ps_->Push(indices, in, from, rank(), step, &r, hyper, /*again=*/true);
    if (!s.ok()) break;
    std::vector<SliceVersion> asked = *into;  // Any incarnation, as Pull's.
    asked.resize(ps_->partition().slices().size());
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) asked[i].incarnation = 0;
    }
    s = ps_->Pull(indices, views, &asked, rank(), step, /*after_push=*/true);
    if (s.ok()) *into = std::move(asked);
  }
  RETURN_IF_ERROR(s);
  if (options.stats != nullptr) options.stats->Add(r);
  if (options.into == nullptr) KeepVersions(indices, pulled);
  return absl::OkStatus();
}

absl::Status Client::Impl::PushNoGradient(const TensorSet& set) {
  RETURN_IF_ERROR(MustBeWorker("PushNoGradient"));
  RETURN_IF_ERROR(TakeStepError());
  RETURN_IF_ERROR(CheckSet(set, set.indices_.size()));
  if (mode_ != Mode::kBsp || set.indices_.empty()) return absl::OkStatus();
  const int64_t step = clock() + 1;
  MarkPushed(set.indices_, step);
  const std::vector<SliceVersion> held = Versions();
  return ps_->PushNoGradient(set.indices_, rank(), step, &held);
}

void Client::Impl::KeepPush(const std::vector<int>& indices,
                            const ConstTensorViews& views,
                            const std::vector<SliceVersion>& from,
                            const std::vector<v1::OptimizerSpec>& specs,
                            int64_t step) {
  KeptPush kept;
  kept.indices = indices;
  for (int t : indices) {
    kept.grads.emplace_back(views[t].begin(), views[t].end());
  }
  kept.from = from;
  kept.specs = specs;
  absl::MutexLock lock(&kept_mu_);
  if (step != kept_step_) {
    kept_step_ = step;
    kept_.clear();
  }
  kept_.push_back(std::move(kept));
}

absl::Status Client::Impl::PushKeptAgain(const std::vector<int>& indices,
                                         int64_t step) {
  std::vector<KeptPush> again;  // Copies: no lock held on the network.
  {
    absl::MutexLock lock(&kept_mu_);
    if (step == kept_step_) {
      for (const KeptPush& k : kept_) {
        if (std::find_first_of(k.indices.begin(), k.indices.end(),
                               indices.begin(),
                               indices.end()) != k.indices.end()) {
          again.push_back(k);
        }
      }
    }
  }
  if (again.empty()) {
    return absl::NotFoundError(
        absl::StrCat("no gradient of step ", step, " kept for these tensors"));
  }
  for (const KeptPush& k : again) {
    ConstTensorViews views(NumTensors());
    TensorOptimizers per_tensor;
    if (!k.specs.empty()) per_tensor.assign(NumTensors(), nullptr);
    for (size_t i = 0; i < k.indices.size(); ++i) {
      views[k.indices[i]] = k.grads[i];
      if (!k.specs.empty()) per_tensor[k.indices[i]] = &k.specs[i];
    }
    PushStats r;
    RETURN_IF_ERROR(ps_->Push(k.indices, views, k.from, rank(), step, &r,
                              k.specs.empty() ? nullptr : &per_tensor,
                              /*again=*/true));
  }
  return absl::OkStatus();
}

void Client::Impl::MarkPushed(const std::vector<int>& indices, int64_t step) {
  if (mode_ != Mode::kBsp) return;
  absl::MutexLock lock(&step_mu_);
  if (step != pushed_step_) {
    pushed_step_ = step;
    pushed_.assign(static_cast<size_t>(NumTensors()), false);
  }
  for (int t : indices) {
    if (static_cast<size_t>(t) < pushed_.size()) pushed_[t] = true;
  }
}

absl::Status Client::Impl::TakeStepError() {
  absl::MutexLock lock(&step_mu_);
  return std::exchange(step_error_, absl::OkStatus());
}

void Client::Impl::EndStep() {
  // The rows' failure is kept by the embedding client for its next call.
  embeddings_.EndStep().IgnoreError();
  absl::Status failed;
  if (mode_ == Mode::kBsp && rank() >= 0 && NumTensors() > 0) {
    // A tensor this rank did not push in the step (a parameter its graph
    // did not use) goes as "no gradient": it counts for the step with
    // zero, as DDP's allreduce would count it, and nobody waits for it.
    const int64_t step = clock() + 1;
    std::vector<int> absent;
    {
      absl::MutexLock lock(&step_mu_);
      for (int t = 0; t < NumTensors(); ++t) {
        if (!PushedLocked(t, step)) absent.push_back(t);
      }
    }
    if (!absent.empty()) {
      const std::vector<SliceVersion> held = Versions();
      failed = ps_->PushNoGradient(absent, rank(), step, &held);
    }
  }
  if (!failed.ok()) {
    absl::MutexLock lock(&step_mu_);
    step_error_ = std::move(failed);
  }
  if (membership_ != nullptr) membership_->clock()->fetch_add(1);
}

absl::Status Client::Impl::PullOptimizerState(
    const std::vector<std::string>& names, std::vector<OptimizerState>* state) {
  ASSIGN_OR_RETURN(const std::vector<int> indices,
                   Indices(names, names.size()));
  std::vector<TensorSlots> slots;
  RETURN_IF_ERROR(ps_->PullState(indices, &slots));
  state->clear();
  for (int t : indices) {
    state->push_back(OptimizerState{std::move(slots[t].slot1),
                                    std::move(slots[t].slot2), slots[t].steps});
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::LoadOptimizerState(
    const std::vector<std::string>& names,
    const std::vector<OptimizerState>& state) {
  RETURN_IF_ERROR(MustBeWorker("LoadOptimizerState"));
  ASSIGN_OR_RETURN(const std::vector<int> indices,
                   Indices(names, state.size()));
  std::vector<TensorSlots> slots(NumTensors());
  for (size_t k = 0; k < indices.size(); ++k) {
    slots[indices[k]] =
        TensorSlots{state[k].slot1, state[k].slot2, state[k].steps};
  }
  return ps_->LoadState(indices, slots, rank());
}

Snapshot Client::Impl::latest() const {
  Snapshot out;
  out.rep_->versions = Versions();
  return out;
}

std::vector<TensorSpec> Client::Impl::tensors() const {
  absl::MutexLock lock(&mu_);
  std::vector<TensorSpec> out;
  for (const v1::TensorSpec& t : model_.tensors()) {
    out.push_back(
        {t.name(),
         {t.shape().begin(), t.shape().end()},
         t.buffer(),
         WireDtypeName(ps_->WireDtype(static_cast<int>(out.size())))});
  }
  return out;
}

absl::Status Client::Impl::MustBeWorker(const char* what) const {
  if (membership_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      what, ": this client is a reader (worker = false), not a worker"));
}

absl::Status Client::Impl::CheckWholeModel(
    const std::vector<absl::Span<float>>& weights) const {
  absl::MutexLock lock(&mu_);
  if (static_cast<int>(weights.size()) != model_.tensors_size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("Recover needs every tensor's weights: ", weights.size(),
                     " buffers for ", model_.tensors_size(), " tensors"));
  }
  for (int t = 0; t < model_.tensors_size(); ++t) {
    const uint64_t elements = ps_->partition().tensor_elements(t);
    if (weights[t].size() != elements) {
      return absl::InvalidArgumentError(absl::StrCat(
          "Recover: tensor '", model_.tensors(t).name(), "' has ", elements,
          " elements but its buffer ", weights[t].size()));
    }
  }
  return absl::OkStatus();
}

absl::Status Client::Impl::Adopt() {
  absl::MutexLock lock(&mu_);
  model_ = ps_->spec();
  num_tensors_ = model_.tensors_size();
  index_.clear();
  for (int t = 0; t < num_tensors_; ++t) {
    index_[model_.tensors(t).name()] = t;
  }
  ++model_generation_;
  versions_.assign(ps_->partition().slices().size(), SliceVersion());
  return absl::OkStatus();
}

absl::StatusOr<TensorSet> Client::Impl::Resolve(
    const std::vector<std::string>& names) const {
  TensorSet set;
  // The indices and the adoption they belong to under one lock: a model
  // adopted in between would leave old indices stamped as new.
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(set.indices_, IndicesLocked(names, names.size()));
  set.names_ = names;
  set.model_ = model_generation_;
  return set;
}

absl::Status Client::Impl::CheckSet(const TensorSet& set,
                                    size_t buffers) const {
  {
    absl::MutexLock lock(&mu_);
    if (set.model_ != model_generation_) {
      return absl::FailedPreconditionError(
          set.model_ < 0 ? "an empty TensorSet: get one from Client::Resolve"
                         : "the TensorSet was resolved for another model "
                           "(one was declared or attached since)");
    }
  }
  if (buffers != set.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(set.size(), " tensors but ", buffers, " buffers"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Client::Impl::Indices(
    const std::vector<std::string>& names, size_t buffers) const {
  absl::MutexLock lock(&mu_);
  return IndicesLocked(names, buffers);
}

absl::StatusOr<std::vector<int>> Client::Impl::IndicesLocked(
    const std::vector<std::string>& names, size_t buffers) const {
  if (num_tensors_ == 0) {
    return absl::FailedPreconditionError(
        "no model yet: call Declare or Attach first");
  }
  if (buffers != names.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(names.size(), " tensor names but ", buffers, " buffers"));
  }
  std::vector<int> indices;
  std::vector<bool> seen(num_tensors_, false);
  for (const std::string& name : names) {
    auto it = index_.find(name);
    if (it == index_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "unknown tensor '", name, "' (the model has ",
          absl::StrJoin(model_.tensors(), ", ",
                        [](std::string* out, const v1::TensorSpec& t) {
                          out->append(t.name());
                        }),
          ")"));
    }
    if (seen[it->second]) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor '", name, "' named twice"));
    }
    seen[it->second] = true;
    indices.push_back(it->second);
  }
  return indices;
}

const std::vector<SliceVersion>& Client::Impl::From(
    const CallOptions& options, std::vector<SliceVersion>* own) const {
  const size_t slices = ps_->partition().slices().size();
  if (options.from != nullptr &&
      options.from->rep_->versions.size() == slices) {
    return options.from->rep_->versions;
  }
  *own = options.from != nullptr ? options.from->rep_->versions : Versions();
  own->resize(slices);
  return *own;
}

void Client::Impl::KeepVersions(const std::vector<int>& indices,
                                const std::vector<SliceVersion>& versions) {
  absl::MutexLock lock(&mu_);
  for (int t : indices) {
    for (int i : ps_->partition().tensor_slices(t)) {
      versions_[i] = versions[i];
    }
  }
}

}  // namespace asyncps
