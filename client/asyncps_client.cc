// asyncps::Client (include/asyncps/client.h): the public class over
// Client::Impl (client/client_impl.h), Snapshot, and connecting.
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "asyncps/client.h"
#include "client/admin_client.h"
#include "client/client_impl.h"
#include "common/cluster_spec.h"
#include "common/optimizer.h"
#include "common/partitioner.h"  // kMaxRank
#include "common/security.h"
#include "common/status.h"
#include "common/wire_dtype.h"

namespace asyncps {
namespace {

absl::Duration Seconds(double s) { return absl::Seconds(s); }

}  // namespace

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
  } else if (o.kind == "delayed_nesterov") {
    spec.set_kind(v1::OptimizerSpec::DELAYED_NESTEROV);
    spec.set_momentum(o.momentum);
    spec.set_delay(o.delay);
  } else if (o.kind == "elastic") {
    spec.set_kind(v1::OptimizerSpec::ELASTIC);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer '", o.kind,
                     "' (want sgd, momentum, adam, adamw, adagrad, "
                     "delayed_nesterov, elastic)"));
  }
  spec.set_learning_rate(o.learning_rate);
  spec.set_weight_decay(o.weight_decay);
  spec.set_lr_decay(o.lr_decay);
  RETURN_IF_ERROR(ValidateOptimizer(spec));
  return spec;
}

void PushStats::Add(const PushStats& other) {
  slices += other.slices;
  total_staleness += other.total_staleness;
  max_staleness = std::max(max_staleness, other.max_staleness);
  dropped += other.dropped;
  front_step = std::max(front_step, other.front_step);
}

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

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(
    const ClientOptions& options) {
  if (!options.mode.empty()) {
    ASSIGN_OR_RETURN(const Mode mode, ParseMode(options.mode));
    if (mode == Mode::kAllreduce) {
      return absl::InvalidArgumentError(
          "mode 'allreduce' trains without the servers (ps_worker does it); "
          "a Client runs async, ssp or bsp");
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Impl> impl, ConnectImpl(options, nullptr));
  return std::make_unique<Client>(std::move(impl));
}

absl::StatusOr<std::unique_ptr<Client::Impl>> ConnectImpl(
    const ClientOptions& options, Timeline* timeline) {
  // "" adopts the servers' mode, read below.
  ASSIGN_OR_RETURN(Mode mode,
                   ParseMode(options.mode.empty() ? "async" : options.mode));
  if (options.num_workers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_workers ", options.num_workers, " must be >= 1"));
  }
  // A rank at or past num_workers is the servers' to refuse (an elastic
  // job takes one).
  if (options.rank < -1 || options.rank >= kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", options.rank, " is outside [-1, ", kMaxRank,
                     ") (-1: assigned)"));
  }
  if (options.slice_bytes < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("slice_bytes ", options.slice_bytes, " must be >= 4"));
  }
  PsClientOptions ps;
  ASSIGN_OR_RETURN(ps.servers,
                   ParseServerList(absl::StrJoin(options.servers, ",")));
  ASSIGN_OR_RETURN(ps.wire_dtype, ParseWireDtype(options.wire_dtype));
  ASSIGN_OR_RETURN(ps.compress, ParseCompression(options.compress));
  ASSIGN_OR_RETURN(ps.transport, ParseTransport(options.transport));
  ps.rpc_timeout = Seconds(options.rpc_timeout_seconds);
  ps.retry_for = Seconds(options.retry_for_seconds);
  SecurityFlags files;
  files.tls_cert = options.tls_cert;
  files.tls_key = options.tls_key;
  files.tls_ca = options.tls_ca;
  files.auth_token_file = options.auth_token_file;
  ASSIGN_OR_RETURN(ps.security, LoadSecurity(files));
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
  return impl;
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
  return Pull(names, out, CallOptions());
}
absl::Status Client::Push(const std::vector<std::string>& names,
                          const std::vector<absl::Span<const float>>& grads) {
  return Push(names, grads, CallOptions());
}
absl::Status Client::PushPull(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& grads,
                              const std::vector<absl::Span<float>>& out) {
  RETURN_IF_ERROR(PushPull(names, grads, out, CallOptions()));
  impl_->EndStep();
  return absl::OkStatus();
}
void Client::EndStep() { impl_->EndStep(); }
absl::Status Client::PushNoGradient(const std::vector<std::string>& names) {
  ASSIGN_OR_RETURN(const TensorSet set, impl_->Resolve(names));
  return impl_->PushNoGradient(set);
}

absl::Status Client::DeclareEmbedding(const std::string& name,
                                      const EmbeddingOptions& options) {
  v1::EmbeddingSpec spec;
  spec.set_name(name);
  spec.set_dim(options.dim);
  spec.set_num_rows(options.num_rows);
  spec.set_max_rows_per_shard(options.max_rows_per_shard);
  spec.set_seed(options.seed);
  if (options.admit_count < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "embedding '", name, "': admit_count ", options.admit_count,
        " is below 1 (1: a row at an id's first push)"));
  }
  spec.set_admit_count(options.admit_count > 1 ? options.admit_count : 0);
  spec.set_ttl_pushes(options.ttl_pushes);
  spec.set_ttl_seconds(options.ttl_seconds);
  if (options.init_stddev > 0) {
    spec.mutable_init()->set_kind(v1::Initializer::NORMAL);
    spec.mutable_init()->set_stddev(options.init_stddev);
  } else {
    spec.mutable_init()->set_kind(v1::Initializer::ZEROS);
  }
  ASSIGN_OR_RETURN(*spec.mutable_optimizer(), ToSpec(options.optimizer));
  return impl_->embeddings()->Declare(spec);
}
absl::Status Client::PullRows(const std::string& name,
                              absl::Span<const int64_t> ids,
                              absl::Span<float> rows) {
  return impl_->embeddings()->PullRows(name, ids, rows);
}
absl::Status Client::PushRows(const std::string& name,
                              absl::Span<const int64_t> ids,
                              absl::Span<const float> grads) {
  return impl_->embeddings()->PushRows(name, ids, grads);
}
absl::Status Client::PushPullRows(const std::string& name,
                                  absl::Span<const int64_t> ids,
                                  absl::Span<const float> grads,
                                  absl::Span<const int64_t> pull_ids,
                                  absl::Span<float> rows) {
  return impl_->embeddings()->PushPullRows(name, ids, grads, pull_ids, rows);
}
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
  w.set_steps_per_second(p.steps_per_second);
  m->Report(w);
}
double Client::FastestStepsPerSecond() const {
  MembershipClient* m = impl_->membership();
  return m == nullptr ? 0.0 : m->fastest_steps_per_second();
}
absl::Status Client::Pull(const std::vector<std::string>& names,
                          const std::vector<absl::Span<float>>& out,
                          const CallOptions& options) {
  ASSIGN_OR_RETURN(const TensorSet set, impl_->Resolve(names));
  return impl_->Pull(set, out, options);
}
absl::Status Client::Push(const std::vector<std::string>& names,
                          const std::vector<absl::Span<const float>>& grads,
                          const CallOptions& options) {
  ASSIGN_OR_RETURN(const TensorSet set, impl_->Resolve(names));
  return impl_->Push(set, grads, options);
}
absl::Status Client::PushPull(const std::vector<std::string>& names,
                              const std::vector<absl::Span<const float>>& grads,
                              const std::vector<absl::Span<float>>& out,
                              const CallOptions& options) {
  ASSIGN_OR_RETURN(const TensorSet set, impl_->Resolve(names));
  return impl_->PushPull(set, grads, out, options);
}
absl::StatusOr<TensorSet> Client::Resolve(
    const std::vector<std::string>& names) const {
  return impl_->Resolve(names);
}
absl::Status Client::Pull(const TensorSet& set,
                          const std::vector<absl::Span<float>>& out,
                          const CallOptions& options) {
  return impl_->Pull(set, out, options);
}
absl::Status Client::Push(const TensorSet& set,
                          const std::vector<absl::Span<const float>>& grads,
                          const CallOptions& options) {
  return impl_->Push(set, grads, options);
}
absl::Status Client::PushPull(const TensorSet& set,
                              const std::vector<absl::Span<const float>>& grads,
                              const std::vector<absl::Span<float>>& out,
                              const CallOptions& options) {
  return impl_->PushPull(set, grads, out, options);
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

Members Client::members() const {
  Members m;
  m.index = std::max(0, impl_->rank());
  m.size = impl_->num_workers();
  const MembershipClient* joined = impl_->membership();
  if (joined == nullptr) return m;
  m.live_ranks = joined->live_ranks();
  m.elastic = joined->elastic();
  if (!m.elastic) return m;
  // The job's first workers split by the size it starts with until every
  // one of them has registered (until then each sees only those before it).
  const int start = joined->start_size();
  if (start > 0 && m.index < start) {
    m.size = start;
    return m;
  }
  auto it = std::lower_bound(m.live_ranks.begin(), m.live_ranks.end(), m.index);
  if (it == m.live_ranks.end() || *it != m.index) {
    it = m.live_ranks.insert(it, m.index);  // Shard 0's view lags its join.
  }
  m.index = static_cast<int>(it - m.live_ranks.begin());
  m.size = static_cast<int>(m.live_ranks.size());
  return m;
}
int64_t Client::clock() const { return impl_->clock(); }
std::vector<TensorSpec> Client::tensors() const { return impl_->tensors(); }
void Client::Leave() { impl_->Leave(); }

}  // namespace asyncps
