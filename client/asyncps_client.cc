// asyncps::Client (include/asyncps/client.h) over PsClient and
// MembershipClient: names to tensor indices, the worker's clock and the
// versions of what it last pulled.
#include <cmath>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "asyncps/client.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/mode.h"
#include "common/model_spec.h"
#include "common/optimizer.h"
#include "common/security.h"
#include "common/status.h"
#include "common/wire_dtype.h"

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
  } else if (o.kind == "adam") {
    spec.set_kind(v1::OptimizerSpec::ADAM);
    spec.set_beta1(o.beta1);
    spec.set_beta2(o.beta2);
    spec.set_epsilon(o.epsilon);
  } else if (o.kind == "adagrad") {
    spec.set_kind(v1::OptimizerSpec::ADAGRAD);
    spec.set_epsilon(o.epsilon);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer '", o.kind, "' (want sgd, momentum, adam, adagrad)"));
  }
  spec.set_learning_rate(o.learning_rate);
  spec.set_weight_decay(o.weight_decay);
  RETURN_IF_ERROR(ValidateOptimizer(spec));
  return spec;
}

absl::Duration Seconds(double s) { return absl::Seconds(s); }

// INVALID_ARGUMENT at the first NaN or infinity of any gradient. Checked
// before anything is sent: each shard refuses such a gradient itself, but
// a push spans shards, and the others would apply their part.
absl::Status CheckFinite(const std::vector<std::string>& names,
                         const std::vector<absl::Span<const float>>& grads) {
  for (size_t k = 0; k < grads.size(); ++k) {
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

}  // namespace

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
                     MembershipClient::Join(ps_.get(), rank, num_workers_,
                                            mode_, heartbeat));
    return absl::OkStatus();
  }

  absl::Status Declare(const std::vector<TensorSpec>& tensors,
                       const std::vector<absl::Span<const float>>& initial,
                       const OptimizerOptions& optimizer) {
    RETURN_IF_ERROR(MustBeWorker("Declare"));
    if (initial.size() != tensors.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("Declare: ", tensors.size(), " tensors but ",
                       initial.size(), " initial buffers"));
    }
    v1::ModelSpec spec;
    spec.set_name("model");
    ASSIGN_OR_RETURN(*spec.mutable_optimizer(), ToSpec(optimizer));
    spec.set_slice_bytes(static_cast<uint64_t>(slice_bytes_));
    spec.set_num_shards(static_cast<uint32_t>(ps_->num_shards()));
    for (const TensorSpec& t : tensors) {
      v1::TensorSpec* out = spec.add_tensors();
      out->set_name(t.name);
      for (int64_t d : t.shape) out->add_shape(d);
      out->set_dtype(v1::DTYPE_F32);
      out->mutable_init()->set_kind(v1::Initializer::ZEROS);
    }
    RETURN_IF_ERROR(ValidateModelSpec(spec));
    RETURN_IF_ERROR(ps_->DeclareModel(spec, initial));
    return Adopt();
  }

  absl::Status Attach() {
    RETURN_IF_ERROR(ps_->FetchModel());
    return Adopt();
  }

  absl::Status Pull(const std::vector<std::string>& names,
                    const std::vector<absl::Span<float>>& out) {
    ASSIGN_OR_RETURN(const std::vector<int> indices,
                     Indices(names, out.size()));
    TensorViews views(NumTensors());
    for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = out[k];
    std::vector<SliceVersion> versions = Versions();
    RETURN_IF_ERROR(ps_->Pull(indices, views, &versions, rank(), clock()));
    KeepVersions(indices, versions);
    return absl::OkStatus();
  }

  absl::Status Push(const std::vector<std::string>& names,
                    const std::vector<absl::Span<const float>>& grads) {
    RETURN_IF_ERROR(MustBeWorker("Push"));
    ASSIGN_OR_RETURN(const std::vector<int> indices,
                     Indices(names, grads.size()));
    RETURN_IF_ERROR(CheckFinite(names, grads));
    ConstTensorViews views(NumTensors());
    for (size_t k = 0; k < indices.size(); ++k) views[indices[k]] = grads[k];
    return ps_->Push(indices, views, Versions(), rank(), clock() + 1, nullptr);
  }

  absl::Status PushPull(const std::vector<std::string>& names,
                        const std::vector<absl::Span<const float>>& grads,
                        const std::vector<absl::Span<float>>& out) {
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
    std::vector<SliceVersion> versions;
    RETURN_IF_ERROR(ps_->PushPull(indices, in, Versions(), rank(), clock() + 1,
                                  views, &versions, nullptr));
    KeepVersions(indices, versions);
    EndStep();
    return absl::OkStatus();
  }

  void EndStep() {
    if (membership_ != nullptr) membership_->clock()->fetch_add(1);
  }

  int rank() const { return membership_ != nullptr ? membership_->rank() : -1; }
  int num_workers() const { return num_workers_; }
  int64_t clock() const {
    return membership_ != nullptr ? membership_->clock()->load() : 0;
  }

  std::vector<TensorSpec> tensors() const {
    absl::MutexLock lock(&mu_);
    std::vector<TensorSpec> out;
    for (const v1::TensorSpec& t : model_.tensors()) {
      out.push_back({t.name(), {t.shape().begin(), t.shape().end()}});
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
  ASSIGN_OR_RETURN(const Mode mode, ParseMode(options.mode));
  if (mode == Mode::kAllreduce) {
    return absl::InvalidArgumentError(
        "mode 'allreduce' trains without the servers (ps_worker does it); "
        "a Client runs async, ssp or bsp");
  }
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
  ASSIGN_OR_RETURN(std::unique_ptr<PsClient> client, PsClient::Create(ps));
  auto impl = std::make_unique<Impl>(std::move(client), mode,
                                     options.num_workers, options.slice_bytes);
  if (options.worker) {
    RETURN_IF_ERROR(
        impl->Join(options.rank, Seconds(options.heartbeat_seconds)));
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() { Leave(); }

absl::Status Client::Declare(
    const std::vector<TensorSpec>& tensors,
    const std::vector<absl::Span<const float>>& initial,
    const OptimizerOptions& optimizer) {
  return impl_->Declare(tensors, initial, optimizer);
}
absl::Status Client::Attach() { return impl_->Attach(); }
absl::Status Client::Pull(const std::vector<std::string>& names,
                          const std::vector<absl::Span<float>>& out) {
  return impl_->Pull(names, out);
}
absl::Status Client::Push(const std::vector<std::string>& names,
                          const std::vector<absl::Span<const float>>& grads) {
  return impl_->Push(names, grads);
}
absl::Status Client::PushPull(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& grads,
                              const std::vector<absl::Span<float>>& out) {
  return impl_->PushPull(names, grads, out);
}
void Client::EndStep() { impl_->EndStep(); }
int Client::rank() const { return impl_->rank(); }
int Client::num_workers() const { return impl_->num_workers(); }
int64_t Client::clock() const { return impl_->clock(); }
std::vector<TensorSpec> Client::tensors() const { return impl_->tensors(); }
void Client::Leave() { impl_->Leave(); }

}  // namespace asyncps
