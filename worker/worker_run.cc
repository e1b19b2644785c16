#include "worker/worker_run.h"

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "asyncps/client.h"
#include "client/admin_client.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "client/worker_client.h"
#include "common/cluster_spec.h"
#include "common/compress.h"
#include "common/file_system.h"
#include "common/initializer.h"
#include "common/metrics_endpoint.h"
#include "common/mode.h"
#include "common/partitioner.h"
#include "common/status.h"
#include "common/transport_kind.h"
#include "common/wire_dtype.h"
#include "glog/logging.h"
#include "worker/data/data_loader.h"
#include "worker/data/idx_reader.h"
#include "worker/device.h"
#include "worker/evaluator.h"
#include "worker/exchange_factory.h"
#include "worker/gpu_metrics.h"
#include "worker/model/mlp.h"
#include "worker/ps_exchange.h"
#include "worker/trainer.h"
#include "worker/worker_metrics.h"

namespace asyncps {
namespace {

// --servers as the client library takes it: one entry a shard, a
// replicated shard's members joined by '|'.
std::vector<std::string> ServerEntries(
    const std::vector<ServerAddress>& servers) {
  std::vector<std::string> entries;
  for (const ServerAddress& shard : servers) {
    entries.push_back(absl::StrJoin(
        shard.Members(), "|", [](std::string* out, const ServerAddress& a) {
          out->append(a.ToString());
        }));
  }
  return entries;
}

// --compress as the client library takes it (a top-k ratio exactly).
std::string CompressText(const Compression& c) {
  if (c.kind != Compression::kTopK) return c.Name();
  return absl::StrFormat("topk:%.17g", c.ratio);
}

// The client library's options for `config`'s flags.
ClientOptions ClientOptionsFrom(const WorkerConfig& config) {
  ClientOptions o;
  o.servers = ServerEntries(config.servers);
  o.rank = config.rank;
  o.num_workers = config.num_workers;
  o.mode = ModeName(config.mode);
  o.wire_dtype = config.evaluator() ? "f32" : WireDtypeName(config.wire_dtype);
  o.compress = CompressText(config.compress);
  o.transport = TransportName(config.transport);
  o.rpc_timeout_seconds = absl::ToDoubleSeconds(config.rpc_timeout);
  o.retry_for_seconds = absl::ToDoubleSeconds(config.retry_for);
  o.heartbeat_seconds = absl::ToDoubleSeconds(config.heartbeat_every);
  o.slice_bytes = static_cast<int64_t>(config.slice_bytes);
  o.tls_cert = config.security.tls_cert;
  o.tls_key = config.security.tls_key;
  o.tls_ca = config.security.tls_ca;
  o.auth_token_file = config.security.auth_token_file;
  o.worker = !config.evaluator();
  return o;
}

// Declares `spec` as the proto it is, with initial weights drawn here from
// its initializers (the numbers a shard would draw: each element depends
// on the seed, the tensor's name and its index only). The first worker to
// declare creates the model.
absl::Status Declare(const v1::ModelSpec& spec, const WorkerClient& worker) {
  std::vector<std::vector<float>> initial;
  for (const v1::TensorSpec& t : spec.tensors()) {
    ASSIGN_OR_RETURN(const uint64_t n, NumElements(t));
    initial.emplace_back(n);
    FillInitial(t.init(), spec.seed(), t.name(), 0,
                absl::MakeSpan(initial.back()));
  }
  return DeclareSpec(worker, spec, {initial.begin(), initial.end()});
}

// The training loop's settings for `config`, resuming where `membership`
// says this rank is.
TrainerConfig TrainerConfigFor(const WorkerConfig& config, const Dataset& data,
                               MembershipClient* membership) {
  TrainerConfig tc;
  tc.rank = config.rank;
  tc.batch_size = config.batch_size;
  tc.accumulate = config.accumulate;
  tc.epochs = config.epochs;
  tc.steps = config.steps;
  if (config.mode == Mode::kAllreduce) {
    // Every rank must stop at the same clock, also after the ring re-formed
    // (a survivor's place in its data then differs from a replacement's):
    // --epochs become the step count of rank 0's share, the same number on
    // every rank, and each loader wraps around as it needs to.
    const int64_t share0 = DataLoader::ShareSize(
        data.size, 0, config.num_workers, config.max_train_examples);
    const int64_t batches =
        (share0 + config.batch_size - 1) / config.batch_size;
    const int64_t epoch_steps =
        config.epochs * batches / config.accumulate +
        (config.epochs * batches % config.accumulate != 0);
    tc.steps =
        config.steps > 0 ? std::min(config.steps, epoch_steps) : epoch_steps;
    tc.epochs = std::numeric_limits<int64_t>::max();
  }
  tc.log_every = config.log_every;
  // The servers count an --outer worker's rounds (one exchange each).
  tc.local_steps = config.outer.local_steps;
  tc.start_clock = membership->start_clock() * tc.local_steps;
  tc.slowdown = config.slowdown;
  tc.stop_at_version = config.stop_at_version;
  tc.steps_done = membership->clock();
  return tc;
}

// The trainer's on_step: each step's report summed into what the
// heartbeats tell the shards (their metrics, psctl status) and into
// `metrics` (may be null); the rate over windows of `clock` (the trainer's).
std::function<void(const StepReport&)> HeartbeatProgress(
    MembershipClient* membership, WorkerMetrics* metrics, Clock* clock) {
  struct State {
    v1::WorkerProgress progress;
    absl::Time window_start;
    int64_t window_samples = 0;
    int64_t window_steps = 0;
  };
  auto state = std::make_shared<State>();
  state->window_start = clock->Now();
  return [membership, metrics, clock, state](const StepReport& r) {
    v1::WorkerProgress& progress = state->progress;
    if (metrics != nullptr) metrics->Step(r);
    progress.set_samples(progress.samples() + r.samples);
    progress.set_loss(r.loss);
    progress.set_data_seconds(progress.data_seconds() + r.data_seconds);
    progress.set_compute_seconds(progress.compute_seconds() +
                                 r.compute_seconds);
    progress.set_exchange_seconds(progress.exchange_seconds() +
                                  r.exchange_seconds);
    progress.set_dropped(progress.dropped() + r.pushed.dropped);
    progress.set_staleness(r.pushed.MeanStaleness());
    state->window_samples += r.samples;
    ++state->window_steps;
    const absl::Time now = clock->Now();
    if (now - state->window_start >= absl::Seconds(1)) {
      const double seconds = absl::ToDoubleSeconds(now - state->window_start);
      progress.set_samples_per_second(state->window_samples / seconds);
      progress.set_steps_per_second(state->window_steps / seconds);
      state->window_steps = 0;
      if (metrics != nullptr) metrics->SetRate(progress.samples_per_second());
      state->window_start = now;
      state->window_samples = 0;
    }
    membership->Report(progress);
  };
}

// The run's result: the "rank R done:" line scripts read, and with
// --result_json the same as JSON.
absl::Status ReportResult(const WorkerConfig& config, const TrainerResult& r,
                          int64_t clock, int64_t sent_bytes) {
  const double rate = r.seconds > 0 ? r.samples / r.seconds : 0.0;
  std::printf(
      "rank %d done: steps %lld samples %lld first_loss %.4f last_loss %.4f "
      "seconds %.1f samples/s %.0f staleness %.2f dropped %lld clock %lld "
      "weights %016llx sent_bytes %lld\n",
      config.rank, static_cast<long long>(r.steps),
      static_cast<long long>(r.samples), r.first_loss, r.last_loss, r.seconds,
      rate, r.mean_staleness, static_cast<long long>(r.dropped),
      static_cast<long long>(clock),
      static_cast<unsigned long long>(r.weights_checksum),
      static_cast<long long>(sent_bytes));
  std::fflush(stdout);
  if (config.result_json.empty()) return absl::OkStatus();
  return Annotate(
      WriteFileAtomically(
          FileSystem::Default(), config.result_json,
          absl::StrFormat(
              "{\"rank\": %d, \"steps\": %d, \"samples\": %d, "
              "\"first_loss\": %.6g, \"last_loss\": %.6g, \"seconds\": "
              "%.3f, \"samples_per_second\": %.1f, \"staleness\": %.4f, "
              "\"dropped\": %d, \"clock\": %d, \"weights\": \"%016x\", "
              "\"sent_bytes\": %d}\n",
              config.rank, r.steps, r.samples, r.first_loss, r.last_loss,
              r.seconds, rate, r.mean_staleness, r.dropped, clock,
              r.weights_checksum, sent_bytes)),
      "--result_json");
}

// Declares `spec` (the first worker to do so creates it), and trains
// until the data, --steps or the shared update budget run out, or `stop`
// is set; prints the result line. `client` has joined the job.
// `endpoint` and `timeline` may be null.
absl::Status Train(const WorkerConfig& flags, const v1::ModelSpec& spec,
                   const WorkerClient& worker, Backend* backend,
                   const Dataset& data, std::atomic<bool>* stop,
                   MetricsEndpoint* endpoint, Timeline* timeline) {
  Client* const client = worker.client.get();
  MembershipClient* const membership = worker.membership;
  RETURN_IF_ERROR(Declare(spec, worker));
  // From here on the rank is known (assigned, with --rank=-1).
  WorkerConfig config = flags;
  config.rank = client->rank();
  std::shared_ptr<WorkerMetrics> owned_metrics;
  WorkerMetrics* metrics = nullptr;
  if (endpoint != nullptr) {
    owned_metrics = std::make_shared<WorkerMetrics>(config.rank);
    owned_metrics->SetTraffic([ps = worker.ps] { return ps->traffic(); });
    endpoint->Register(owned_metrics);
    metrics = owned_metrics.get();
  }
  if (timeline != nullptr) {
    timeline->NameProcess(absl::StrCat("worker ", config.rank));
  }
  DataLoader loader(&data, config.rank, config.num_workers, config.seed,
                    config.max_train_examples);
  if (membership->elastic()) {
    // Its place among the live workers, each epoch (docs/ELASTIC.md).
    loader.FollowMembership([client] {
      const Members m = client->members();
      return std::make_pair(m.index, m.size);
    });
  } else {
    // A replacement picks the rank's share up where the job has it.
    loader.Skip(membership->start_clock() * config.outer.local_steps *
                    config.accumulate,
                config.batch_size);
  }
  Mlp model(backend, config.layers, config.batch_size);
  std::unique_ptr<GradientExchange> exchange = MakeExchange(
      config, worker, backend->cuda_device(), model.LayerTensors(), stop);
  TrainerConfig tc = TrainerConfigFor(config, data, membership);
  tc.timeline = timeline;
  tc.on_step = HeartbeatProgress(membership, metrics, tc.clock);
  LOG(INFO) << "ps_worker rank " << config.rank << "/" << config.num_workers
            << " on " << backend->Name() << ": " << client->model_name() << ", "
            << loader.share() << " training examples, " << client->num_shards()
            << " shards, wire " << WireDtypeName(config.wire_dtype)
            << ", exchange " << ExchangeModeName(config.Exchange()) << " over "
            << TransportName(config.transport);
  TrainerResult r;
  absl::Status s =
      asyncps::Train(tc, &model, &loader, exchange.get(), stop, &r);
  exchange.reset();
  client->Leave();
  RETURN_IF_ERROR(s);
  return ReportResult(config, r, membership->clock()->load(),
                      client->traffic().sent_bytes);
}

// Says what protects this worker's calls (a bad --tls_* or token file is
// the error).
absl::Status LogSecurity(const WorkerConfig& config) {
  ASSIGN_OR_RETURN(const Security security, LoadSecurity(config.security));
  LOG(INFO) << (config.evaluator() ? std::string("evaluator")
                : config.rank < 0  ? std::string("worker (rank to come)")
                                   : absl::StrCat("rank ", config.rank))
            << ": " << security.Describe(/*server=*/false);
  return absl::OkStatus();
}

// The Fashion-MNIST set this role reads (the evaluator: the test set);
// INVALID_ARGUMENT if it, or the share of `rank`, is empty.
absl::StatusOr<Dataset> ReadData(const WorkerConfig& config, int rank) {
  ASSIGN_OR_RETURN(
      Dataset data,
      ReadFashionMnist(config.data_dir, config.evaluator() ? "t10k" : "train"));
  const int64_t share =
      config.evaluator()
          ? data.size
          : DataLoader::ShareSize(data.size, rank, config.num_workers,
                                  config.max_train_examples);
  if (data.size == 0 || share == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--data_dir=", config.data_dir, ": the ",
                     config.evaluator() ? "test" : "training", " set has ",
                     data.size, " images, ", share, " of them for rank ", rank,
                     " of ", config.num_workers, "; nothing to ",
                     config.evaluator() ? "score" : "train on"));
  }
  return data;
}

// The evaluator's --until_done: true once every shard says every worker
// has finished.
JobDone EveryWorkerFinished(const WorkerClient& worker) {
  return [ps = worker.ps]() -> absl::StatusOr<bool> {
    if (ps == nullptr) return false;  // No shards to ask.
    ASSIGN_OR_RETURN(const std::vector<v1::StatsResponse> stats,
                     AdminClient(ps->caller()).StatsAll());
    for (const v1::StatsResponse& s : stats) {
      if (!s.job_done()) return false;
    }
    return !stats.empty();
  };
}

}  // namespace

absl::Status RunWorker(const WorkerConfig& config, std::atomic<bool>* stop,
                       absl::Notification* stopped, bool* refused_at_start) {
  *refused_at_start = true;
  // A worker's rank before it joins (rank 0's stands in for one the
  // servers will assign): for its device and the size of its share.
  const int rank = std::max(config.rank, 0);
  // A busy metrics port is a start-up error, found before any work. The
  // workers' metrics are registered once their rank is known (Train).
  std::unique_ptr<MetricsEndpoint> endpoint;
  std::shared_ptr<WorkerMetrics> eval_metrics;
  if (config.metrics_port > 0) {
    ASSIGN_OR_RETURN(endpoint,
                     MetricsEndpoint::Start("0.0.0.0", config.metrics_port,
                                            "--metrics_port"));
    if (config.evaluator()) {
      eval_metrics = WorkerMetrics::ForEvaluator();
      endpoint->Register(eval_metrics);
    }
  }
  std::unique_ptr<Timeline> timeline;
  if (!config.timeline.empty()) {
    ASSIGN_OR_RETURN(
        timeline, Timeline::Open(config.timeline,
                                 config.evaluator()
                                     ? std::string("evaluator")
                                     : absl::StrCat("worker ", config.rank)));
    timeline->NameThread("train loop");
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend,
                   MakeBackend(config.device.Name(), config.precision, rank,
                               config.blas_threads));
  std::shared_ptr<GpuMetrics> gpu_metrics;
  if (endpoint != nullptr && backend->cuda_device() >= 0) {
    auto gpu = GpuMetrics::Open(backend->cuda_device());
    if (gpu.ok()) {
      gpu_metrics = *std::move(gpu);
      endpoint->Register(gpu_metrics);
    } else {
      LOG(WARNING) << "no GPU metrics: " << gpu.status().message();
    }
  }
  RETURN_IF_ERROR(LogSecurity(config));
  ASSIGN_OR_RETURN(Dataset data, ReadData(config, rank));
  *refused_at_start = false;
  const std::vector<int>& layers = config.layers;
  if (!config.evaluator()) {
    // Before joining the job.
    RETURN_IF_ERROR(CheckLayersFit(layers, data.features));
  }
  // A worker joins the job here (its rank, heartbeats); the evaluator
  // connects as a reader.
  ASSIGN_OR_RETURN(WorkerClient worker,
                   ConnectWorker(ClientOptionsFrom(config), timeline.get()));
  Client* const client = worker.client.get();
  if (eval_metrics != nullptr) {
    eval_metrics->SetTraffic([ps = worker.ps] { return ps->traffic(); });
  }
  // The scrapes stop before the client and metrics they read go.
  struct StopFirst {
    std::unique_ptr<MetricsEndpoint>* endpoint;
    ~StopFirst() { endpoint->reset(); }
  } stop_first{&endpoint};
  if (config.evaluator()) {
    return RunEvaluatorRole(config, client, backend.get(), &data, stopped,
                            eval_metrics.get(), EveryWorkerFinished(worker));
  }
  return Train(config,
               MlpSpec(layers,
                       config.outer.kind == WorkerConfig::Outer::kNone
                           ? config.optimizer
                           : config.outer.optimizer,
                       config.seed, config.slice_bytes, client->num_shards()),
               worker, backend.get(), data, stop, endpoint.get(),
               timeline.get());
}

}  // namespace asyncps
