// ps_worker: trains a model through the asyncps parameter servers, or, with
// --role=evaluator, scores the servers' current weights on the test set.
//
//   ps_worker --servers=127.0.0.1:5000,127.0.0.1:5001 --rank=0 --num_workers=2
//   ps_worker --servers=... --role=evaluator --eval_every=5 --curve=curve.csv
//
// Every worker declares the model (idempotent); weights start on the
// servers. SIGTERM or SIGINT stops a worker after its current step, and makes
// the evaluator score once more and exit.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/cluster_spec.h"
#include "common/mode.h"
#include "common/optimizer.h"
#include "common/status.h"
#include "common/stop_signal.h"
#include "glog/logging.h"
#include "worker/allreduce_exchange.h"
#include "worker/data/data_loader.h"
#include "worker/data/idx_reader.h"
#include "worker/device.h"
#include "worker/evaluator.h"
#include "worker/model/mlp.h"
#include "worker/ps_client.h"
#include "worker/ps_exchange.h"
#include "worker/trainer.h"

ABSL_FLAG(std::string, role, "worker", "worker or evaluator.");
ABSL_FLAG(std::string, servers, "127.0.0.1:5000",
          "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(int, rank, 0, "This worker's rank, in [0, num_workers).");
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
ABSL_FLAG(absl::Duration, heartbeat_every, absl::Seconds(1),
          "Period of the worker's heartbeats.");

namespace asyncps {
namespace {

absl::StatusOr<v1::OptimizerSpec> OptimizerFromFlags() {
  v1::OptimizerSpec o;
  const std::string name = absl::GetFlag(FLAGS_optimizer);
  if (name == "sgd") {
    o.set_kind(v1::OptimizerSpec::SGD);
  } else if (name == "momentum" || name == "nesterov") {
    o.set_kind(v1::OptimizerSpec::MOMENTUM);
    o.set_momentum(static_cast<float>(absl::GetFlag(FLAGS_momentum)));
    o.set_nesterov(name == "nesterov");
  } else if (name == "adam") {
    o.set_kind(v1::OptimizerSpec::ADAM);
    o.set_beta1(0.9f);
    o.set_beta2(0.999f);
    o.set_epsilon(1e-8f);
  } else if (name == "adagrad") {
    o.set_kind(v1::OptimizerSpec::ADAGRAD);
    o.set_epsilon(1e-10f);
    o.set_initial_accumulator_value(0.1f);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--optimizer=", name,
                     " (want sgd, momentum, nesterov, adam, adagrad)"));
  }
  o.set_learning_rate(static_cast<float>(absl::GetFlag(FLAGS_lr)));
  o.set_weight_decay(static_cast<float>(absl::GetFlag(FLAGS_weight_decay)));
  o.set_lr_decay(static_cast<float>(absl::GetFlag(FLAGS_lr_decay)));
  absl::Status s = ValidateOptimizer(o);
  if (!s.ok()) return s;
  return o;
}

absl::Status CheckFlags() {
  const int n = absl::GetFlag(FLAGS_num_workers);
  const int rank = absl::GetFlag(FLAGS_rank);
  const std::string role = absl::GetFlag(FLAGS_role);
  if (role != "worker" && role != "evaluator") {
    return absl::InvalidArgumentError(
        absl::StrCat("--role=", role, " (want worker or evaluator)"));
  }
  auto mode = ParseMode(absl::GetFlag(FLAGS_mode));
  if (!mode.ok()) return mode.status();
  if (!(absl::GetFlag(FLAGS_slowdown) >= 1.0)) {
    return absl::InvalidArgumentError("--slowdown must be >= 1");
  }
  if (n < 1 || rank < 0 || rank >= n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank=", rank, " must be in [0, --num_workers=", n, ")"));
  }
  if (absl::GetFlag(FLAGS_batch_size) < 1 ||
      absl::GetFlag(FLAGS_batch_size) > 65536) {
    return absl::InvalidArgumentError("--batch_size must be in [1, 65536]");
  }
  if (absl::GetFlag(FLAGS_accumulate) < 1) {
    return absl::InvalidArgumentError("--accumulate must be >= 1");
  }
  if (absl::GetFlag(FLAGS_epochs) < 1) {
    return absl::InvalidArgumentError("--epochs must be >= 1");
  }
  return absl::OkStatus();
}

int Fail(const absl::Status& s) {
  LOG(ERROR) << s;
  std::fprintf(stderr, "ps_worker: %s\n", s.ToString().c_str());
  // Also on stdout, where scripts and tests read the worker's results.
  std::printf("ps_worker failed: %s\n", s.ToString().c_str());
  std::fflush(stdout);
  return 1;
}

int Run() {
  absl::Status flags = CheckFlags();
  if (!flags.ok()) return Fail(flags);
  auto servers = ParseServerList(absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) return Fail(Annotate(servers.status(), "--servers"));
  auto layers = ParseLayers(absl::GetFlag(FLAGS_layers));
  if (!layers.ok()) return Fail(layers.status());
  auto optimizer = OptimizerFromFlags();
  if (!optimizer.ok()) return Fail(optimizer.status());
  const bool evaluator = absl::GetFlag(FLAGS_role) == "evaluator";
  const int rank = absl::GetFlag(FLAGS_rank);

  auto precision = ParsePrecision(absl::GetFlag(FLAGS_precision));
  if (!precision.ok()) return Fail(precision.status());
  auto made = MakeBackend(absl::GetFlag(FLAGS_device), *precision, rank,
                          absl::GetFlag(FLAGS_blas_threads));
  if (!made.ok()) return Fail(made.status());
  std::unique_ptr<Backend> backend = *std::move(made);

  // A stop signal ends training after the current step.
  InstallStopSignalHandlers();
  static std::atomic<bool> stop{false};
  static absl::Notification stopped;
  std::thread([] {
    WaitForStopSignal();
    stop = true;
    stopped.Notify();
  }).detach();

  const std::string split = evaluator ? "t10k" : "train";
  auto data = ReadFashionMnist(absl::GetFlag(FLAGS_data_dir), split);
  if (!data.ok()) return Fail(data.status());

  PsClientOptions options;
  options.servers = *servers;
  options.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  options.retry_for = absl::GetFlag(FLAGS_retry_for);
  auto client = PsClient::Create(options);
  if (!client.ok()) return Fail(client.status());
  v1::ModelSpec spec = MlpSpec(*layers, *optimizer, absl::GetFlag(FLAGS_seed),
                               absl::GetFlag(FLAGS_slice_bytes),
                               static_cast<int>(servers->size()));
  if (evaluator) {
    // The evaluator scores whatever model the workers declared.
    absl::Status fetched = (*client)->FetchModel();
    if (!fetched.ok()) return Fail(fetched);
    spec = (*client)->spec();
    layers = LayersFromSpec(spec);
    if (!layers.ok()) return Fail(layers.status());
  } else {
    absl::Status declared = (*client)->DeclareModel(spec);
    if (!declared.ok()) return Fail(declared);
  }
  if (layers->front() != data->features || layers->back() != 10) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--layers must start with ", data->features,
                     " (pixels per image) and end with 10 (classes)")));
  }

  if (evaluator) {
    int64_t limit = absl::GetFlag(FLAGS_max_test_examples);
    if (limit > 0 && limit < data->size) data->size = limit;
    Mlp model(backend.get(), *layers, 1000);
    if (absl::GetFlag(FLAGS_eval_once)) {
      auto e = EvaluateOnce(client->get(), &model, *data, absl::Now());
      if (!e.ok()) return Fail(e.status());
      std::printf("evaluator updates=%.0f test_loss=%.4f accuracy=%.4f\n",
                  e->updates, e->loss, e->accuracy);
      if (!absl::GetFlag(FLAGS_curve).empty()) {
        absl::Status s = AppendCurveRow(absl::GetFlag(FLAGS_curve), *e);
        if (!s.ok()) return Fail(s);
      }
      return 0;
    }
    absl::Status s = RunEvaluator(client->get(), &model, *data,
                                  absl::GetFlag(FLAGS_eval_every),
                                  absl::GetFlag(FLAGS_curve), &stopped);
    return s.ok() ? 0 : Fail(s);
  }

  // Membership: register with every shard, then heartbeat. A worker that
  // (re)joins starts at the job's clock.
  const Mode mode = *ParseMode(absl::GetFlag(FLAGS_mode));
  char host[256] = "";
  gethostname(host, sizeof(host) - 1);
  v1::RegisterRequest join;
  join.set_rank(rank);
  join.set_num_workers(absl::GetFlag(FLAGS_num_workers));
  join.set_host(host);
  std::vector<int64_t> incarnations((*client)->num_shards());
  int64_t start_clock = 0;
  int64_t attempt = 0;
  for (int s = 0; s < (*client)->num_shards(); ++s) {
    auto r = (*client)->Register(s, join);
    if (!r.ok()) return Fail(r.status());
    if (r->mode() != ModeName(mode)) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("shard ", s, " runs --mode=", r->mode(),
                       " but this worker has --mode=", ModeName(mode),
                       "; start both with the same mode")));
    }
    incarnations[s] = r->incarnation();
    start_clock = std::max(start_clock, r->resume_clock());
    if (s == 0) attempt = r->attempt();
  }
  absl::Notification heartbeat_done;
  std::atomic<int64_t> clock{start_clock};
  auto heartbeat_to = [&](int shard, bool leaving) {
    v1::HeartbeatRequest req;
    req.set_rank(rank);
    req.set_incarnation(incarnations[shard]);
    req.set_clock(clock.load());
    req.set_leaving(leaving);
    return (*client)->Heartbeat(shard, req);
  };
  std::thread heartbeat([&] {
    while (!heartbeat_done.WaitForNotificationWithTimeout(
        absl::GetFlag(FLAGS_heartbeat_every))) {
      for (int s = 0; s < (*client)->num_shards(); ++s) {
        absl::Status hs = heartbeat_to(s, /*leaving=*/false);
        if (hs.code() == absl::StatusCode::kNotFound) {
          // The shard restarted and forgot us: join again.
          auto r = (*client)->Register(s, join);
          if (r.ok()) {
            incarnations[s] = r->incarnation();
          } else {
            LOG(WARNING) << "re-register with shard " << s << ": "
                         << r.status();
          }
        } else if (!hs.ok() && hs.code() != absl::StatusCode::kUnavailable) {
          LOG(WARNING) << "heartbeat to shard " << s << ": " << hs;
        }
      }
    }
  });

  DataLoader loader(&*data, rank, absl::GetFlag(FLAGS_num_workers),
                    absl::GetFlag(FLAGS_seed),
                    absl::GetFlag(FLAGS_max_train_examples));
  Mlp model(backend.get(), *layers, absl::GetFlag(FLAGS_batch_size));
  const std::vector<std::vector<int>> layer_tensors = model.LayerTensors();
  std::unique_ptr<GradientExchange> exchange;
  if (mode == Mode::kAllreduce) {
    AllreduceConfig ar;
    ar.rank = rank;
    ar.num_workers = absl::GetFlag(FLAGS_num_workers);
    ar.host = absl::GetFlag(FLAGS_collective_host);
    ar.timeout = absl::GetFlag(FLAGS_collective_timeout);
    ar.assign_every = absl::GetFlag(FLAGS_assign_every);
    ar.attempt = attempt;
    ar.cuda_device = backend->cuda_device();
    ar.collective = absl::GetFlag(FLAGS_collective);
    if (ar.collective == "auto") {
      ar.collective = ar.cuda_device >= 0 ? "nccl" : "gloo";
    }
    exchange =
        std::make_unique<AllreduceExchange>(client->get(), ar, layer_tensors);
  } else {
    exchange = std::make_unique<PsExchange>(client->get(), rank, layer_tensors);
  }
  TrainerConfig config;
  config.rank = rank;
  config.batch_size = absl::GetFlag(FLAGS_batch_size);
  config.accumulate = absl::GetFlag(FLAGS_accumulate);
  config.epochs = absl::GetFlag(FLAGS_epochs);
  config.steps = absl::GetFlag(FLAGS_steps);
  config.log_every = absl::GetFlag(FLAGS_log_every);
  config.start_clock = start_clock;
  config.slowdown = absl::GetFlag(FLAGS_slowdown);
  config.stop_at_version = absl::GetFlag(FLAGS_stop_at_version);
  config.clock = &clock;
  LOG(INFO) << "ps_worker rank " << rank << "/"
            << absl::GetFlag(FLAGS_num_workers) << " on " << backend->Name()
            << ": " << spec.name() << ", " << loader.share()
            << " training examples, " << servers->size() << " shards";
  TrainerResult result;
  absl::Status s =
      Train(config, &model, &loader, exchange.get(), &stop, &result);
  heartbeat_done.Notify();
  heartbeat.join();
  // A last heartbeat with the final clock (a job restarted later resumes
  // from it), saying this worker leaves, so ssp and bsp stop waiting for it.
  for (int shard = 0; shard < (*client)->num_shards(); ++shard) {
    heartbeat_to(shard, /*leaving=*/true).IgnoreError();
  }
  if (!s.ok()) return Fail(s);
  std::printf(
      "rank %d done: steps %lld samples %lld first_loss %.4f last_loss %.4f "
      "seconds %.1f samples/s %.0f staleness %.2f dropped %lld clock %lld "
      "weights %016llx\n",
      rank, static_cast<long long>(result.steps),
      static_cast<long long>(result.samples), result.first_loss,
      result.last_loss, result.seconds,
      result.seconds > 0 ? result.samples / result.seconds : 0.0,
      result.mean_staleness, static_cast<long long>(result.dropped),
      static_cast<long long>(clock.load()),
      static_cast<unsigned long long>(result.weights_checksum));
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Trains through the asyncps parameter servers, or evaluates.\n"
      "  ps_worker --servers=h:p,h:p --rank=0 --num_workers=2\n"
      "  ps_worker --servers=h:p,h:p --role=evaluator --curve=curve.csv");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return asyncps::Run();
}
