// asyncps::Client (include/asyncps/client.h) over PsClient and
// MembershipClient: names to tensor indices, the worker's clock and the
// versions of what it last pulled.
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "asyncps/client.h"
#include "client/admin_client.h"
#include "client/client_internal.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/mode.h"
#include "common/model_spec.h"
#include "common/optimizer.h"
#include "common/security.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"

namespace asyncps {

namespace {

absl::StatusOr<v1::OptimizerSpec> ToSpec(const OptimizerOptions& o) {
  v1::OptimizerSpec spec;
  if (o.kind == "sgd") {
    spec.set_kind(v1::OptimizerSpec::SGD);
  } else if (o.kind == "momentum") {
    spec.set_kind(v1::OptimizerSpec::MOMENTUM);
    spec.set_momentum(o.momentum);
    spec.set_nesterov(o.nesterov);
    spec.set_dampening(o.dampening);
  } else if (o.kind == "adam" || o.kind == "adamw") {
    spec.set_kind(o.kind == "adam" ? v1::OptimizerSpec::ADAM
                                   : v1::OptimizerSpec::ADAMW);
    spec.set_beta1(o.beta1);
    spec.set_beta2(o.beta2);
    spec.set_epsilon(o.epsilon);
  } else if (o.kind == "adagrad") {
    spec.set_kind(v1::OptimizerSpec::ADAGRAD);
    spec.set_epsilon(o.epsilon);
    spec.set_initial_accumulator_value(o.initial_accumulator_value);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer '", o.kind, "' (want sgd, momentum, adam, adamw, adagrad)"));
  }
  spec.set_learning_rate(o.learning_rate);
  spec.set_weight_decay(o.weight_decay);
  spec.set_lr_decay(o.lr_decay);
  RETURN_IF_ERROR(ValidateOptimizer(spec));
  return spec;
}

absl::Duration Seconds(double s) { return absl::Seconds(s); }

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

PushStats ToStats(const PushResult& r) {
  PushStats out;
  out.slices = r.slices;
  out.total_staleness = r.total_staleness;
  out.max_staleness = r.max_staleness;
  out.dropped = r.dropped;
  out.front_step = r.front_step;
  return out;
}

}  // namespace

void PushStats::Add(const PushStats& other) {
  slices += other.slices;
  total_staleness += other.total_staleness;
  max_staleness = std::max(max_staleness, other.max_staleness);
  dropped += other.dropped;
  front_step = std::max(front_step, other.front_step);
}

struct Snapshot::Rep {
  std::vector<SliceVersion> versions;  // Indexed like the partition's slices.
};

Snapshot::Snapshot() : rep_(std::make_unique<Rep>()) {}
Snapshot::~Snapshot() = default;
Snapshot::Snapshot(const Snapshot& other)
    : rep_(std::make_unique<Rep>(*other.rep_)) {}
Snapshot& Snapshot::operator=(const Snapshot& other) {
  *rep_ = *other.rep_;
  return *this;
}
Snapshot::Snapshot(Snapshot&& other) noexcept
    : rep_(std::make_unique<Rep>(std::move(*other.rep_))) {}
Snapshot& Snapshot::operator=(Snapshot&& other) noexcept {
  rep_->versions.swap(other.rep_->versions);
  return *this;
}

int64_t Snapshot::min_version() const {
  if (rep_->versions.empty()) return -1;
  int64_t lowest = rep_->versions[0].version;
  for (const SliceVersion& v : rep_->versions) {
    lowest = std::min(lowest, v.version);
  }
  return lowest;
}

double Snapshot::mean_version() const {
  if (rep_->versions.empty()) return 0;
  double sum = 0;
  for (const SliceVersion& v : rep_->versions) sum += v.version;
  return sum / rep_->versions.size();
}

class Client::Impl {
 public:
  Impl(std::unique_ptr<PsClient> ps, Mode mode, int num_workers,
       int64_t slice_bytes)
      : ps_(std::move(ps)),
        mode_(mode),
        num_workers_(num_workers),
        slice_bytes_(slice_bytes) {}

  absl::Status Join(int rank, absl::Duration heartbeat) {
    ASSIGN_OR_RETURN(membership_,
                     MembershipClient::Join(ps_->caller(), rank, num_workers_,
                                            mode_, heartbeat));
    return absl::OkStatus();
  }

  absl::Status Declare(const std::vector<TensorSpec>& tensors,
                       const std::vector<absl::Span<const float>>& initial,
                       const OptimizerOptions& optimizer,
                       const std::string& model_name) {
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
    RETURN_IF_ERROR(ValidateModelSpec(spec));
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
    RETURN_IF_ERROR(ps_->DeclareModel(spec, initial));
    for (size_t t = 0; t < wire.size(); ++t) {
      if (wire[t] == v1::DTYPE_UNSPECIFIED) {
        wire[t] = ps_->WireDtype(static_cast<int>(t));
      }
    }
    RETURN_IF_ERROR(ps_->SetWireDtypes(wire));
    return Adopt();
  }

  absl::Status Attach() {
    RETURN_IF_ERROR(ps_->FetchModel());
    return Adopt();
  }

  absl::Status Pull(const std::vector<std::string>& names,
                    const std::vector<absl::Span<float>>& out,
                    const CallOptions& options) {
    ASSIGN_OR_RETURN(const std::vector<int> indices,
                     Indices(names, out.size()));
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
    if (options.any_incarnation) {
      // Not told to the shards, and not forgotten here: a gradient pushed
      // again after a failed pull still says where its weights came from.
      std::vector<SliceVersion> asked = *versions;
      for (int t : indices) {
        for (int i : ps_->partition().tensor_slices(t))
          asked[i].incarnation = 0;
      }
      RETURN_IF_ERROR(
          ps_->Pull(indices, views, &asked, rank(), step, options.after_push));
      for (int t : indices) {
        for (int i : ps_->partition().tensor_slices(t))
          (*versions)[i] = asked[i];
      }
    } else {
      RETURN_IF_ERROR(ps_->Pull(indices, views, versions, rank(), step,
                                options.after_push));
    }
    if (options.into == nullptr) KeepVersions(indices, own);
    return absl::OkStatus();
  }

  absl::Status Push(const std::vector<std::string>& names,
                    const std::vector<absl::Span<const float>>& grads,
                    const CallOptions& options) {
    RETURN_IF_ERROR(MustBeWorker("Push"));
    ASSIGN_OR_RETURN(const std::vector<int> indices,
                     Indices(names, grads.size()));
    RETURN_IF_ERROR(CheckFinite(names, grads));
    ConstTensorViews views(NumTensors());
    for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = grads[k];
    std::vector<SliceVersion> own;
    const std::vector<SliceVersion>& from = From(options, &own);
    const int64_t step = options.step >= 0 ? options.step : clock() + 1;
    std::vector<v1::OptimizerSpec> specs;
    TensorOptimizers per_tensor;
    RETURN_IF_ERROR(Optimizers(names, indices, options, &specs, &per_tensor));
    PushResult r;
    RETURN_IF_ERROR(ps_->Push(indices, views, from, rank(), step, &r,
                              specs.empty() ? nullptr : &per_tensor));
    if (options.stats != nullptr) options.stats->Add(ToStats(r));
    return absl::OkStatus();
  }

  // options.optimizers as specs (`*specs` owns them) and per tensor
  // index; `*per_tensor` stays empty without them. INVALID_ARGUMENT naming
  // the tensor for a bad one or another kind than the declared one.
  absl::Status Optimizers(const std::vector<std::string>& names,
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
      if (!spec.ok())
        return Annotate(spec.status(), "tensor '" + names[k] + "'");
      if (spec->kind() != ps_->spec().optimizer().kind()) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor '", names[k], "': optimizer '",
                         (*options.optimizers)[k].kind,
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

  absl::Status PushPull(const std::vector<std::string>& names,
                        const std::vector<absl::Span<const float>>& grads,
                        const std::vector<absl::Span<float>>& out,
                        const CallOptions& options) {
    RETURN_IF_ERROR(MustBeWorker("PushPull"));
    ASSIGN_OR_RETURN(const std::vector<int> indices,
                     Indices(names, grads.size()));
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
    PushResult r;
    RETURN_IF_ERROR(ps_->PushPull(indices, in, from, rank(), step, views, into,
                                  &r, specs.empty() ? nullptr : &per_tensor));
    if (options.stats != nullptr) options.stats->Add(ToStats(r));
    if (options.into == nullptr) KeepVersions(indices, pulled);
    return absl::OkStatus();
  }

  absl::Status Recover(const absl::Status& failure,
                       const std::vector<absl::Span<float>>& weights,
                       Snapshot* snapshot) {
    if (failure.code() != absl::StatusCode::kFailedPrecondition) {
      return failure;
    }
    const int n = NumTensors();
    if (n == 0) return failure;
    RETURN_IF_ERROR(CheckWholeModel(weights));
    std::vector<int> all(n);
    for (int t = 0; t < n; ++t) all[t] = t;
    std::vector<SliceVersion>& versions = snapshot->rep_->versions;
    versions.resize(ps_->partition().slices().size());
    ASSIGN_OR_RETURN(const std::vector<int> lost, ps_->ShardsWithoutModel());
    if (lost.empty()) {
      // Another worker may have declared the model again meanwhile: then a
      // shard's incarnation is not the one our weights came from.
      std::vector<std::vector<float>> fresh(n);
      for (int t = 0; t < n; ++t) fresh[t].resize(weights[t].size());
      std::vector<SliceVersion> fresh_versions;
      RETURN_IF_ERROR(ps_->Pull(all, &fresh, &fresh_versions, -1, 0));
      bool restarted = false;
      for (size_t i = 0; i < versions.size() && i < fresh_versions.size();
           ++i) {
        restarted |= versions[i].incarnation != 0 &&
                     versions[i].incarnation != fresh_versions[i].incarnation;
      }
      if (!restarted) return failure;
      for (int t = 0; t < n; ++t) {
        std::copy(fresh[t].begin(), fresh[t].end(), weights[t].begin());
      }
      versions.swap(fresh_versions);
      return absl::OkStatus();
    }
    const ConstTensorViews held(weights.begin(), weights.end());
    for (int shard : lost) {
      ASSIGN_OR_RETURN(const bool created, ps_->Redeclare(shard));
      if (!created) continue;  // Another worker restores it.
      LOG(WARNING) << "shard " << shard
                   << " restarted without the model: restoring it from rank "
                   << rank() << "'s copy";
      absl::Status restored = ps_->Restore(shard, held, versions, rank());
      // FAILED_PRECONDITION: the shard stopped waiting (--restore_wait).
      if (!restored.ok() &&
          restored.code() != absl::StatusCode::kFailedPrecondition) {
        return restored;
      }
    }
    // As no worker (rank -1): a restored shard's steps and clocks must not
    // hold this pull.
    const TensorViews views(weights.begin(), weights.end());
    return ps_->Pull(all, views, &versions, -1, 0);
  }

  absl::Status Recover(const absl::Status& failure,
                       const std::vector<absl::Span<float>>& weights) {
    Snapshot own = latest();
    RETURN_IF_ERROR(Recover(failure, weights, &own));
    absl::MutexLock lock(&mu_);
    versions_ = own.rep_->versions;
    return absl::OkStatus();
  }

  void SetClock(int64_t clock) {
    if (membership_ != nullptr) membership_->clock()->store(clock);
  }

  void EndStep() {
    if (membership_ != nullptr) membership_->clock()->fetch_add(1);
  }

  int rank() const { return membership_ != nullptr ? membership_->rank() : -1; }
  int num_workers() const { return num_workers_; }
  int64_t clock() const {
    return membership_ != nullptr ? membership_->clock()->load() : 0;
  }

  Mode mode() const { return mode_; }

  absl::Status PullOptimizerState(const std::vector<std::string>& names,
                                  std::vector<OptimizerState>* state) {
    ASSIGN_OR_RETURN(const std::vector<int> indices,
                     Indices(names, names.size()));
    std::vector<TensorSlots> slots;
    RETURN_IF_ERROR(ps_->PullState(indices, &slots));
    state->clear();
    for (int t : indices) {
      state->push_back(OptimizerState{std::move(slots[t].slot1),
                                      std::move(slots[t].slot2),
                                      slots[t].steps});
    }
    return absl::OkStatus();
  }

  absl::Status LoadOptimizerState(const std::vector<std::string>& names,
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
  std::string model_name() const {
    absl::MutexLock lock(&mu_);
    return model_.name();
  }
  int num_shards() const { return ps_->num_shards(); }
  Snapshot latest() const {
    Snapshot out;
    out.rep_->versions = Versions();
    return out;
  }
  TrafficStats traffic() const {
    const Traffic t = ps_->traffic();
    return {t.sent_bytes, t.received_bytes, t.retries};
  }
  PsClient* ps() const { return ps_.get(); }
  MembershipClient* membership() const { return membership_.get(); }

  std::vector<TensorSpec> tensors() const {
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

  void Leave() {
    if (membership_ != nullptr) membership_->Leave();
  }

 private:
  absl::Status MustBeWorker(const char* what) const {
    if (membership_ != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        what, ": this client is a reader (worker = false), not a worker"));
  }

  // INVALID_ARGUMENT unless `weights` holds every tensor at its size.
  absl::Status CheckWholeModel(
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

  // Takes the model PsClient adopted: names, and versions all unknown.
  absl::Status Adopt() {
    absl::MutexLock lock(&mu_);
    model_ = ps_->spec();
    num_tensors_ = model_.tensors_size();
    index_.clear();
    for (int t = 0; t < num_tensors_; ++t) {
      index_[model_.tensors(t).name()] = t;
    }
    versions_.assign(ps_->partition().slices().size(), SliceVersion());
    return absl::OkStatus();
  }

  // The indices of `names`, which `buffers` buffers go with.
  absl::StatusOr<std::vector<int>> Indices(
      const std::vector<std::string>& names, size_t buffers) const {
    absl::MutexLock lock(&mu_);
    if (num_tensors_ == 0) {
      return absl::FailedPreconditionError(
          "no model yet: call Declare or Attach first");
    }
    if (buffers != names.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          names.size(), " tensor names but ", buffers, " buffers"));
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

  int NumTensors() const {
    absl::MutexLock lock(&mu_);
    return num_tensors_;
  }

  // The versions a push names: `options.from`'s, or a copy of the latest
  // pull's in `own`.
  const std::vector<SliceVersion>& From(const CallOptions& options,
                                        std::vector<SliceVersion>* own) const {
    const size_t slices = ps_->partition().slices().size();
    if (options.from != nullptr &&
        options.from->rep_->versions.size() == slices) {
      return options.from->rep_->versions;
    }
    *own = options.from != nullptr ? options.from->rep_->versions : Versions();
    own->resize(slices);
    return *own;
  }

  std::vector<SliceVersion> Versions() const {
    absl::MutexLock lock(&mu_);
    return versions_;
  }

  // Keeps what a pull of `indices` brought.
  void KeepVersions(const std::vector<int>& indices,
                    const std::vector<SliceVersion>& versions) {
    absl::MutexLock lock(&mu_);
    for (int t : indices) {
      for (int i : ps_->partition().tensor_slices(t)) {
        versions_[i] = versions[i];
      }
    }
  }

  const std::unique_ptr<PsClient> ps_;
  const Mode mode_;
  const int num_workers_;
  const int64_t slice_bytes_;
  std::unique_ptr<MembershipClient> membership_;

  mutable absl::Mutex mu_;
  v1::ModelSpec model_ ABSL_GUARDED_BY(mu_);
  int num_tensors_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> index_ ABSL_GUARDED_BY(mu_);
  // Per slice, the version last pulled (what a push was computed from).
  std::vector<SliceVersion> versions_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  if (options.mode.empty()) return ClientInternals::Connect(options, nullptr);
  ASSIGN_OR_RETURN(const Mode mode, ParseMode(options.mode));
  if (mode == Mode::kAllreduce) {
    return absl::InvalidArgumentError(
        "mode 'allreduce' trains without the servers (ps_worker does it); "
        "a Client runs async, ssp or bsp");
  }
  return ClientInternals::Connect(options, nullptr);
}

absl::StatusOr<std::unique_ptr<Client>> ClientInternals::Connect(
    const ClientOptions& options, Timeline* timeline) {
  // "" adopts the servers' mode, read below.
  ASSIGN_OR_RETURN(Mode mode,
                   ParseMode(options.mode.empty() ? "async" : options.mode));
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers ", options.num_workers, " must be >= 1"));
  }
  if (options.rank < -1 || options.rank >= options.num_workers) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is outside [-1, num_workers ",
                     options.num_workers, ")"));
  }
  if (options.slice_bytes < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice_bytes ", options.slice_bytes, " must be >= 4"));
  }
  PsClientOptions ps;
  ASSIGN_OR_RETURN(ps.servers,
                   ParseServerList(absl::StrJoin(options.servers, ",")));
  ASSIGN_OR_RETURN(ps.wire_dtype, ParseWireDtype(options.wire_dtype));
  ASSIGN_OR_RETURN(ps.transport, ParseTransport(options.transport));
  ps.rpc_timeout = Seconds(options.rpc_timeout_seconds);
  ps.retry_for = Seconds(options.retry_for_seconds);
  SecurityFlags files;
  files.tls_cert = options.tls_cert;
  files.tls_key = options.tls_key;
  files.tls_ca = options.tls_ca;
  files.auth_token_file = options.auth_token_file;
  ASSIGN_OR_RETURN(ps.security, LoadSecurity(files));
  if (ps.security.tls()) {
    ps.transport = Transport::kGrpc;  // The data plane has no TLS.
  }
  ps.timeline = timeline;
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Create(ps));
  if (options.mode.empty()) {
    ASSIGN_OR_RETURN(const v1::StatsResponse stats,
                     AdminClient(client->caller()).Stats(0));
    ASSIGN_OR_RETURN(mode, ParseMode(stats.mode()));
    if (mode == Mode::kAllreduce) {
      return absl::FailedPreconditionError(
          "the servers run --mode=allreduce, which trains without them "
          "(ps_worker does it); a Client runs async, ssp or bsp");
    }
  }
  auto impl = std::make_unique<Client::Impl>(
      std::move(client), mode, options.num_workers, options.slice_bytes);
  if (options.worker) {
    RETURN_IF_ERROR(
        impl->Join(options.rank, Seconds(options.heartbeat_seconds)));
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

PsClient* ClientInternals::ps(const Client& client) {
  return client.impl_->ps();
}

MembershipClient* ClientInternals::membership(const Client& client) {
  return client.impl_->membership();
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Leave(); }

absl::Status Client::Declare(
    const std::vector<TensorSpec>& tensors,
    const std::vector<absl::Span<const float>>& initial,
    const OptimizerOptions& optimizer, const std::string& model_name) {
  return impl_->Declare(tensors, initial, optimizer, model_name);
}
absl::Status Client::Attach() { return impl_->Attach(); }
absl::Status Client::Pull(const std::vector<std::string>& names,
                          const std::vector<absl::Span<float>>& out) {
  return impl_->Pull(names, out, CallOptions());
}
absl::Status Client::Push(const std::vector<std::string>& names,
                          const std::vector<absl::Span<const float>>& grads) {
  return impl_->Push(names, grads, CallOptions());
}
absl::Status Client::PushPull(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& grads,
                              const std::vector<absl::Span<float>>& out) {
  RETURN_IF_ERROR(impl_->PushPull(names, grads, out, CallOptions()));
  impl_->EndStep();
  return absl::OkStatus();
}
void Client::EndStep() { impl_->EndStep(); }
absl::Status Client::PullOptimizerState(const std::vector<std::string>& names,
                                        std::vector<OptimizerState>* state) {
  return impl_->PullOptimizerState(names, state);
}
absl::Status Client::LoadOptimizerState(
    const std::vector<std::string>& names,
    const std::vector<OptimizerState>& state) {
  return impl_->LoadOptimizerState(names, state);
}
void Client::ReportProgress(const Progress& p) {
  MembershipClient* m = impl_->membership();
  if (m == nullptr) return;
  v1::WorkerProgress w;
  w.set_samples(p.samples);
  w.set_samples_per_second(p.samples_per_second);
  w.set_loss(p.loss);
  w.set_data_seconds(p.data_seconds);
  w.set_compute_seconds(p.compute_seconds);
  w.set_exchange_seconds(p.exchange_seconds);
  m->Report(w);
}
absl::Status Client::Pull(const std::vector<std::string>& names,
                          const std::vector<absl::Span<float>>& out,
                          const CallOptions& options) {
  return impl_->Pull(names, out, options);
}
absl::Status Client::Push(const std::vector<std::string>& names,
                          const std::vector<absl::Span<const float>>& grads,
                          const CallOptions& options) {
  return impl_->Push(names, grads, options);
}
absl::Status Client::PushPull(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& grads,
                              const std::vector<absl::Span<float>>& out,
                              const CallOptions& options) {
  return impl_->PushPull(names, grads, out, options);
}
void Client::SetClock(int64_t clock) { impl_->SetClock(clock); }
absl::Status Client::Recover(const absl::Status& failure,
                             const std::vector<absl::Span<float>>& weights,
                             Snapshot* snapshot) {
  return impl_->Recover(failure, weights, snapshot);
}
absl::Status Client::Recover(const absl::Status& failure,
                             const std::vector<absl::Span<float>>& weights) {
  return impl_->Recover(failure, weights);
}
std::string Client::model_name() const { return impl_->model_name(); }
std::string Client::mode() const { return ModeName(impl_->mode()); }
int Client::num_shards() const { return impl_->num_shards(); }
Snapshot Client::latest() const { return impl_->latest(); }
TrafficStats Client::traffic() const { return impl_->traffic(); }
int Client::rank() const { return impl_->rank(); }
int Client::num_workers() const { return impl_->num_workers(); }
int64_t Client::clock() const { return impl_->clock(); }
std::vector<TensorSpec> Client::tensors() const { return impl_->tensors(); }
void Client::Leave() { impl_->Leave(); }

}  // namespace asyncps
