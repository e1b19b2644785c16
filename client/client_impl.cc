// Client::Impl (client/client_impl.h), the model it holds: declaring or
// adopting one, names to tensor indices and TensorSets, the versions last
// pulled, and optimizer state. The data calls are in client_data.cc, the
// bsp implicit step in client_step.cc, recovery in client_recovery.cc.
#include "client/client_impl.h"

#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/model_spec.h"
#include "common/status.h"
#include "common/wire_dtype.h"

namespace asyncps {

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
  RETURN_IF_ERROR(Adopt());
  return AwaitJoinedStep();
}

absl::Status Client::Impl::AwaitJoinedStep() {
  if (mode_ != Mode::kBsp || JoinedAt() == 0 || awaited_join_) {
    return absl::OkStatus();
  }
  awaited_join_ = true;
  std::vector<int> all(NumTensors());
  std::iota(all.begin(), all.end(), 0);
  std::vector<std::vector<float>> weights;
  for (int t : all) weights.emplace_back(ps_->partition().tensor_elements(t));
  std::vector<SliceVersion> versions = Versions();
  RETURN_IF_ERROR(ps_->Pull(all, &weights, &versions, rank(), clock()));
  KeepVersions(all, versions);
  return absl::OkStatus();
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
