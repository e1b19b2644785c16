// ps_worker: trains a model through the asyncps parameter servers, or, with
// --role=evaluator, scores the servers' current weights on the test set.
//
//   ps_worker --servers=127.0.0.1:5000,127.0.0.1:5001 --rank=0 --num_workers=2
//   ps_worker --servers=... --role=evaluator --eval_every=5 --curve=curve.csv
//
// Every worker declares the model (idempotent); weights start on the
// servers. SIGTERM or SIGINT stops a worker after its current step, and makes
// the evaluator score once more and exit.
#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "asyncps/client.h"
#include "client/client_internal.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/initializer.h"
#include "common/large_buffers.h"
#include "common/metrics_endpoint.h"
#include "common/partitioner.h"
#include "common/security_flags.h"
#include "common/status.h"
#include "common/stop_signal.h"
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
#include "worker/worker_config.h"
#include "worker/worker_metrics.h"

ABSL_FLAG(std::string, role, "worker", "worker or evaluator.");
ABSL_FLAG(std::string, servers, "127.0.0.1:5000",
          "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(int, rank, 0,
          "This worker's rank, in [0, num_workers); -1: the servers assign "
          "the lowest rank not live (replicas of one container image).");
ABSL_FLAG(int, num_workers, 1,
          "Workers in the job; each trains on 1/num_workers of the data.");
ABSL_FLAG(std::string, mode, "async",
          "async, ssp or bsp (through the servers, which must run the same "
          "--mode), or allreduce (Gloo ring all-reduce among the workers).");
ABSL_FLAG(double, slowdown, 1.0,
          "Straggler simulation: each step's compute takes this many times "
          "as long (the worker sleeps the difference).");
ABSL_FLAG(std::string, collective, "auto",
          "allreduce: gloo (ring over TCP, host memory), nccl (between GPUs; "
          "CUDA builds), or auto (nccl when the worker runs on a GPU).");
ABSL_FLAG(std::string, collective_host, "127.0.0.1",
          "allreduce: the address other workers reach this one on.");
ABSL_FLAG(absl::Duration, collective_timeout, absl::Seconds(30),
          "allreduce: how long a collective may wait for a peer.");
ABSL_FLAG(int64_t, assign_every, 50,
          "allreduce: rank 0 hands the servers its weights every this many "
          "steps (and at the end).");
ABSL_FLAG(std::string, device, "auto",
          "auto, cpu, or cuda:N. auto takes a GPU if this build has CUDA and "
          "one is present, else the CPU.");
ABSL_FLAG(std::string, precision, "fp32",
          "GEMM precision on a GPU: fp32, tf32, or bf16 (tensor cores, f32 "
          "accumulation; the servers keep f32 weights).");
ABSL_FLAG(std::string, layers, "784,256,128,10",
          "MLP layer sizes, input first, classes last.");
ABSL_FLAG(std::string, optimizer, "momentum",
          "Server-side optimizer: sgd, momentum, nesterov, adam, adagrad.");
ABSL_FLAG(double, lr, 0.02, "Learning rate.");
ABSL_FLAG(double, momentum, 0.9, "Momentum for momentum and nesterov.");
ABSL_FLAG(double, weight_decay, 0.0, "L2 weight decay.");
ABSL_FLAG(double, lr_decay, 0.0,
          "Inverse-time decay: the t-th update of a slice uses lr / (1 + "
          "lr_decay * t).");
ABSL_FLAG(int, batch_size, 64, "Examples per micro-batch.");
ABSL_FLAG(int, accumulate, 1, "Micro-batches summed before one push.");
ABSL_FLAG(int64_t, epochs, 1, "Passes over this worker's share of the data.");
ABSL_FLAG(int64_t, steps, 0, "If > 0, stop after this many steps.");
ABSL_FLAG(int64_t, stop_at_version, 0,
          "If > 0, stop once the servers have applied this many updates to "
          "every slice (a budget shared by all workers; async and ssp).");
ABSL_FLAG(uint64_t, seed, 1,
          "Seeds the weights (via the servers) and data order.");
ABSL_FLAG(uint64_t, slice_bytes, 4 << 20, "Largest slice of a tensor.");
ABSL_FLAG(std::string, data_dir, "/usr/share/datasets/fashion-mnist",
          "Directory with the Fashion-MNIST IDX files.");
ABSL_FLAG(
    int64_t, max_train_examples, 0,
    "If > 0, train on at most this many examples of this worker's share.");
ABSL_FLAG(int64_t, max_test_examples, 0,
          "If > 0, the evaluator scores only the first this-many test images.");
ABSL_FLAG(absl::Duration, log_every, absl::Seconds(5),
          "Period of the worker's progress line.");
ABSL_FLAG(absl::Duration, eval_every, absl::Seconds(5),
          "Evaluator: period between evaluations.");
ABSL_FLAG(bool, eval_once, false, "Evaluator: score once and exit.");
ABSL_FLAG(std::string, curve, "", "Evaluator: CSV file to append rows to.");
ABSL_FLAG(int, blas_threads, 1, "OpenBLAS threads (CPU backend).");
ABSL_FLAG(absl::Duration, rpc_timeout, absl::Seconds(30),
          "Deadline of each RPC.");
ABSL_FLAG(absl::Duration, retry_for, absl::Seconds(60),
          "Give up after the servers have been unreachable this long.");
ABSL_FLAG(std::string, wire_dtype, "f32",
          "f32, bf16 or f16: the dtype gradients and weights travel in "
          "(rounded to nearest even; the servers keep f32 weights and "
          "optimizer state). The evaluator always pulls f32.");
ABSL_FLAG(int, metrics_port, 0,
          "TCP port of Prometheus' /metrics (samples/s, loss, step phases, "
          "traffic; the evaluator's accuracy); 0: none.");
ABSL_FLAG(std::string, timeline, "",
          "Write a Chrome trace-event timeline of each step (data, compute "
          "per layer, pull/push, waits) to this file; merge a run's files "
          "with psctl timeline. Empty: none.");
ABSL_FLAG(std::string, transport, "tcp",
          "How pulls and pushes travel: tcp (each shard's data plane: framed "
          "TCP with no protobuf copy of a tensor; the fast path) or grpc (the "
          "gRPC service, e.g. for servers run with --data_port=-1). Every "
          "other call uses gRPC either way.");
ABSL_FLAG(std::string, exchange, "fused",
          "async only (ssp and bsp always use layered): fused (one PushPull "
          "per shard at the end of each step: the gradients go, the weights "
          "they produced come back), prefetch (fused, sent while the next "
          "step computes on the weights already here: faster, each gradient "
          "one step staler), or layered (a push and a pull per layer as "
          "backward produces it).");
ABSL_FLAG(absl::Duration, heartbeat_every, absl::Seconds(1),
          "Period of the worker's heartbeats.");

namespace asyncps {
namespace {

WorkerConfig ConfigFromFlags() {
  WorkerConfig c;
  c.role = absl::GetFlag(FLAGS_role);
  c.servers = absl::GetFlag(FLAGS_servers);
  c.rank = absl::GetFlag(FLAGS_rank);
  c.num_workers = absl::GetFlag(FLAGS_num_workers);
  c.mode = absl::GetFlag(FLAGS_mode);
  c.slowdown = absl::GetFlag(FLAGS_slowdown);
  c.collective = absl::GetFlag(FLAGS_collective);
  c.collective_host = absl::GetFlag(FLAGS_collective_host);
  c.collective_timeout = absl::GetFlag(FLAGS_collective_timeout);
  c.assign_every = absl::GetFlag(FLAGS_assign_every);
  c.device = absl::GetFlag(FLAGS_device);
  c.precision = absl::GetFlag(FLAGS_precision);
  c.layers = absl::GetFlag(FLAGS_layers);
  c.optimizer = absl::GetFlag(FLAGS_optimizer);
  c.lr = absl::GetFlag(FLAGS_lr);
  c.momentum = absl::GetFlag(FLAGS_momentum);
  c.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  c.lr_decay = absl::GetFlag(FLAGS_lr_decay);
  c.batch_size = absl::GetFlag(FLAGS_batch_size);
  c.accumulate = absl::GetFlag(FLAGS_accumulate);
  c.epochs = absl::GetFlag(FLAGS_epochs);
  c.steps = absl::GetFlag(FLAGS_steps);
  c.stop_at_version = absl::GetFlag(FLAGS_stop_at_version);
  c.seed = absl::GetFlag(FLAGS_seed);
  c.slice_bytes = absl::GetFlag(FLAGS_slice_bytes);
  c.data_dir = absl::GetFlag(FLAGS_data_dir);
  c.max_train_examples = absl::GetFlag(FLAGS_max_train_examples);
  c.max_test_examples = absl::GetFlag(FLAGS_max_test_examples);
  c.log_every = absl::GetFlag(FLAGS_log_every);
  c.eval_every = absl::GetFlag(FLAGS_eval_every);
  c.eval_once = absl::GetFlag(FLAGS_eval_once);
  c.curve = absl::GetFlag(FLAGS_curve);
  c.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  c.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  c.retry_for = absl::GetFlag(FLAGS_retry_for);
  c.heartbeat_every = absl::GetFlag(FLAGS_heartbeat_every);
  c.wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  c.exchange = absl::GetFlag(FLAGS_exchange);
  c.transport = absl::GetFlag(FLAGS_transport);
  c.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  c.timeline = absl::GetFlag(FLAGS_timeline);
  c.security = SecurityFlagsFromCommandLine();
  return c;
}

// Exit statuses: 1, training failed; 2, refused at start (a bad flag, or
// data that cannot be trained on), before touching the network.
int Fail(const absl::Status& s, int code = 1) {
  LOG(ERROR) << s;
  std::fprintf(stderr, "ps_worker: %s\n", s.ToString().c_str());
  // Also on stdout, where scripts and tests read the worker's results.
  std::printf("ps_worker failed: %s\n", s.ToString().c_str());
  std::fflush(stdout);
  return code;
}

// The client library's options for `config`'s flags.
ClientOptions ClientOptionsFrom(const WorkerConfig& config) {
  ClientOptions o;
  o.servers = absl::StrSplit(config.servers, ',', absl::SkipEmpty());
  o.rank = config.rank;
  o.num_workers = config.num_workers;
  o.mode = config.mode;
  o.wire_dtype = config.evaluator() ? "f32" : config.wire_dtype;
  o.transport = config.transport;
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

OptimizerOptions OptimizerOptionsFrom(const v1::OptimizerSpec& spec) {
  OptimizerOptions o;
  switch (spec.kind()) {
    case v1::OptimizerSpec::MOMENTUM:
      o.kind = "momentum";
      break;
    case v1::OptimizerSpec::ADAM:
      o.kind = "adam";
      break;
    case v1::OptimizerSpec::ADAGRAD:
      o.kind = "adagrad";
      break;
    default:
      o.kind = "sgd";
  }
  o.learning_rate = spec.learning_rate();
  o.momentum = spec.momentum();
  o.nesterov = spec.nesterov();
  o.beta1 = spec.beta1();
  o.beta2 = spec.beta2();
  o.epsilon = spec.epsilon();
  o.weight_decay = spec.weight_decay();
  o.lr_decay = spec.lr_decay();
  o.initial_accumulator_value = spec.initial_accumulator_value();
  return o;
}

// Declares `spec` through the client library: its tensors, with initial
// weights drawn here from the spec's initializers (the numbers a shard
// would draw: each element depends on the seed, the tensor's name and its
// index only). The first worker to declare creates the model.
absl::Status Declare(const v1::ModelSpec& spec, Client* client) {
  std::vector<TensorSpec> tensors;
  std::vector<std::vector<float>> initial;
  for (const v1::TensorSpec& t : spec.tensors()) {
    ASSIGN_OR_RETURN(const uint64_t n, NumElements(t));
    tensors.push_back({t.name(), {t.shape().begin(), t.shape().end()}});
    initial.emplace_back(n);
    FillInitial(t.init(), spec.seed(), t.name(), 0,
                absl::MakeSpan(initial.back()));
  }
  return client->Declare(tensors, {initial.begin(), initial.end()},
                         OptimizerOptionsFrom(spec.optimizer()), spec.name());
}

// Declares `spec` (the first worker to do so creates it), and trains
// until the data, --steps or the shared update budget run out, or `stop`
// is set; prints the result line. `client` has joined the job.
// `endpoint` and `timeline` may be null.
absl::Status Train(const WorkerConfig& flags, const v1::ModelSpec& spec,
                   Client* client, Backend* backend, const Dataset& data,
                   std::atomic<bool>* stop, MetricsEndpoint* endpoint,
                   Timeline* timeline) {
  MembershipClient* membership = ClientInternals::membership(*client);
  RETURN_IF_ERROR(Declare(spec, client));
  // From here on the rank is known (assigned, with --rank=-1).
  WorkerConfig config = flags;
  config.rank = client->rank();
  std::shared_ptr<WorkerMetrics> owned_metrics;
  WorkerMetrics* metrics = nullptr;
  if (endpoint != nullptr) {
    owned_metrics = std::make_shared<WorkerMetrics>(config.rank);
    owned_metrics->SetTraffic(
        [ps = ClientInternals::ps(*client)] { return ps->traffic(); });
    endpoint->Register(owned_metrics);
    metrics = owned_metrics.get();
  }
  if (timeline != nullptr) {
    timeline->NameProcess(absl::StrCat("worker ", config.rank));
  }
  DataLoader loader(&data, config.rank, config.num_workers, config.seed,
                    config.max_train_examples);
  // A replacement picks the rank's share up where the job has it.
  loader.Skip(membership->start_clock() * config.accumulate, config.batch_size);
  Mlp model(backend, config.Layers(), config.batch_size);
  std::unique_ptr<GradientExchange> exchange = MakeExchange(
      config, client, backend->cuda_device(), membership->attempt(),
      model.LayerTensors(), [membership] { return membership->Rejoin(); });
  TrainerConfig tc;
  tc.rank = config.rank;
  tc.batch_size = config.batch_size;
  tc.accumulate = config.accumulate;
  tc.epochs = config.epochs;
  tc.steps = config.steps;
  if (config.ParsedMode() == Mode::kAllreduce) {
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
  tc.start_clock = membership->start_clock();
  tc.slowdown = config.slowdown;
  tc.stop_at_version = config.stop_at_version;
  tc.clock = membership->clock();
  tc.timeline = timeline;
  // What the heartbeats tell the shards (their metrics, psctl status).
  v1::WorkerProgress progress;
  absl::Time window_start = absl::Now();
  int64_t window_samples = 0;
  tc.on_step = [&, m = membership](const StepReport& r) {
    if (metrics != nullptr) metrics->Step(r);
    progress.set_samples(progress.samples() + r.samples);
    progress.set_loss(r.loss);
    progress.set_data_seconds(progress.data_seconds() + r.data_seconds);
    progress.set_compute_seconds(progress.compute_seconds() +
                                 r.compute_seconds);
    progress.set_exchange_seconds(progress.exchange_seconds() +
                                  r.exchange_seconds);
    progress.set_dropped(progress.dropped() + r.dropped);
    progress.set_staleness(r.staleness);
    window_samples += r.samples;
    const absl::Time now = absl::Now();
    if (now - window_start >= absl::Seconds(1)) {
      progress.set_samples_per_second(
          window_samples / absl::ToDoubleSeconds(now - window_start));
      if (metrics != nullptr) {
        metrics->SetRate(progress.samples_per_second());
      }
      window_start = now;
      window_samples = 0;
    }
    m->Report(progress);
  };
  LOG(INFO) << "ps_worker rank " << config.rank << "/" << config.num_workers
            << " on " << backend->Name() << ": " << client->model_name() << ", "
            << loader.share() << " training examples, " << client->num_shards()
            << " shards, wire " << config.wire_dtype << ", exchange "
            << PsExchange::ModeName(config.Exchange()) << " over "
            << config.transport;
  TrainerResult r;
  absl::Status s =
      asyncps::Train(tc, &model, &loader, exchange.get(), stop, &r);
  exchange.reset();
  client->Leave();
  RETURN_IF_ERROR(s);
  std::printf(
      "rank %d done: steps %lld samples %lld first_loss %.4f last_loss %.4f "
      "seconds %.1f samples/s %.0f staleness %.2f dropped %lld clock %lld "
      "weights %016llx\n",
      config.rank, static_cast<long long>(r.steps),
      static_cast<long long>(r.samples), r.first_loss, r.last_loss, r.seconds,
      r.seconds > 0 ? r.samples / r.seconds : 0.0, r.mean_staleness,
      static_cast<long long>(r.dropped),
      static_cast<long long>(membership->clock()->load()),
      static_cast<unsigned long long>(r.weights_checksum));
  std::fflush(stdout);
  return absl::OkStatus();
}

// Everything after the flags were checked: device, data, servers, role.
absl::Status Run(const WorkerConfig& config, std::atomic<bool>* stop,
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
                   MakeBackend(config.device, config.Precision(), rank,
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
  ASSIGN_OR_RETURN(const Security security, LoadSecurity(config.security));
  LOG(INFO) << (config.evaluator() ? std::string("evaluator")
                : config.rank < 0  ? std::string("worker (rank to come)")
                                   : absl::StrCat("rank ", config.rank))
            << ": " << security.Describe(/*server=*/false)
            << (security.tls() && config.transport == "tcp"
                    ? "; tensors over gRPC (the data plane has no TLS)"
                    : "");
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
  *refused_at_start = false;
  const std::vector<int> layers = config.Layers();
  if (!config.evaluator()) {
    // Before joining the job.
    RETURN_IF_ERROR(CheckLayersFit(layers, data.features));
  }
  // A worker joins the job here (its rank, heartbeats); the evaluator
  // connects as a reader.
  ASSIGN_OR_RETURN(
      std::unique_ptr<Client> client,
      ClientInternals::Connect(ClientOptionsFrom(config), timeline.get()));
  if (eval_metrics != nullptr) {
    eval_metrics->SetTraffic(
        [ps = ClientInternals::ps(*client)] { return ps->traffic(); });
  }
  // The scrapes stop before the client and metrics they read go.
  struct StopFirst {
    std::unique_ptr<MetricsEndpoint>* endpoint;
    ~StopFirst() { endpoint->reset(); }
  } stop_first{&endpoint};
  if (config.evaluator()) {
    return RunEvaluatorRole(config, client.get(), backend.get(), &data, stopped,
                            eval_metrics.get());
  }
  return Train(config,
               MlpSpec(layers, config.Optimizer(), config.seed,
                       config.slice_bytes, client->num_shards()),
               client.get(), backend.get(), data, stop, endpoint.get(),
               timeline.get());
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains through the asyncps parameter servers, or evaluates.\n"
      "  ps_worker --servers=h:p,h:p --rank=0 --num_workers=2\n"
      "  ps_worker --servers=h:p,h:p --role=evaluator --curve=curve.csv");
  absl::ParseCommandLine(argc, argv);
  asyncps::KeepLargeBuffers();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  const asyncps::WorkerConfig config = asyncps::ConfigFromFlags();
  if (absl::Status s = config.Validate(); !s.ok()) {
    return asyncps::Fail(s, 2);
  }

  // A stop signal ends training after the current step, and makes the
  // evaluator score once more.
  asyncps::InstallStopSignalHandlers();
  std::atomic<bool> stop{false};
  absl::Notification stopped;
  std::thread watcher([&] {
    if (asyncps::WaitForStopSignal() != 0) stop = true;
    stopped.Notify();
  });
  bool refused_at_start = false;
  const absl::Status s =
      asyncps::Run(config, &stop, &stopped, &refused_at_start);
  asyncps::WakeStopWaiter();
  watcher.join();
  return s.ok() ? 0 : asyncps::Fail(s, refused_at_start ? 2 : 1);
}
