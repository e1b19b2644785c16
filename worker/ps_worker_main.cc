// ps_worker: trains a model through the asyncps parameter servers, or, with
// --role=evaluator, scores the servers' current weights on the test set.
//
//   ps_worker --servers=127.0.0.1:5000,127.0.0.1:5001 --rank=0 --num_workers=2
//   ps_worker --servers=... --role=evaluator --eval_every=5 --curve=curve.csv
//
// Every worker declares the model (idempotent); weights start on the
// servers. SIGTERM or SIGINT stops a worker after its current step, and makes
// the evaluator score once more and exit.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/internal/parse.h"
#include "absl/flags/marshalling.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/large_buffers.h"
#include "common/program_flags.h"
#include "common/security_flags.h"
#include "common/stop_signal.h"
#include "glog/logging.h"
#include "worker/worker_config.h"
#include "worker/worker_run.h"

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
          "Server-side optimizer: sgd, momentum, nesterov, adam, adagrad "
          "(with --outer, the worker's own inner optimizer).");
ABSL_FLAG(std::string, outer, "none",
          "none, diloco or easgd: --local_steps steps here with --optimizer, "
          "then one exchange; the servers apply the outer optimizer "
          "(docs/MODES.md \"Outer optimizers\").");
ABSL_FLAG(int, local_steps, 1, "--outer: steps between exchanges (>= 1).");
ABSL_FLAG(bool, dynamic_local_steps, false,
          "--outer=diloco --mode=async: each round takes --local_steps scaled "
          "by this worker's steps/s over the fastest worker's (at least 1).");
ABSL_FLAG(double, outer_lr, 0.7, "--outer=diloco: the outer Nesterov rate.");
ABSL_FLAG(double, outer_momentum, 0.9,
          "--outer=diloco: the outer Nesterov momentum, in [0, 1).");
ABSL_FLAG(double, alpha, 0.0,
          "--outer=easgd: the moving rate, in (0, 1); 0: 0.9 / num_workers.");
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
ABSL_FLAG(bool, until_done, false,
          "Evaluator: once every worker of the job has finished (the shards "
          "say so), score the final model and exit 0: a batch job's "
          "evaluator (ps_server --exit_when_done keeps the model readable "
          "for --done_linger).");
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
ABSL_FLAG(std::string, compress, "none",
          "How gradients travel to the servers, with error feedback on the "
          "worker: none (in --wire_dtype), bf16, topk:RATIO (the "
          "largest-magnitude fraction of each slice, e.g. topk:0.01) or "
          "onebit (signs and one scale a slice). docs/COMPRESSION.md.");
ABSL_FLAG(int, metrics_port, 0,
          "TCP port of Prometheus' /metrics (samples/s, loss, step phases, "
          "traffic; the evaluator's accuracy); 0: none.");
ABSL_FLAG(std::string, result_json, "",
          "At the end, write the result as JSON to this file (atomically): "
          "rank, steps, samples, first_loss, last_loss, seconds, "
          "samples_per_second, staleness, dropped, clock, weights; the "
          "evaluator's: role, seconds, updates, test_loss, accuracy (of its "
          "last evaluation). Empty: none (the \"rank R done:\" and "
          "evaluator lines say the same).");
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

WorkerFlags FlagsFromCommandLine() {
  WorkerFlags c;
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
  c.outer = absl::GetFlag(FLAGS_outer);
  c.local_steps = absl::GetFlag(FLAGS_local_steps);
  c.dynamic_local_steps = absl::GetFlag(FLAGS_dynamic_local_steps);
  c.outer_lr = absl::GetFlag(FLAGS_outer_lr);
  c.outer_momentum = absl::GetFlag(FLAGS_outer_momentum);
  c.alpha = absl::GetFlag(FLAGS_alpha);
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
  c.until_done = absl::GetFlag(FLAGS_until_done);
  c.curve = absl::GetFlag(FLAGS_curve);
  c.blas_threads = absl::GetFlag(FLAGS_blas_threads);
  c.rpc_timeout = absl::GetFlag(FLAGS_rpc_timeout);
  c.retry_for = absl::GetFlag(FLAGS_retry_for);
  c.heartbeat_every = absl::GetFlag(FLAGS_heartbeat_every);
  c.wire_dtype = absl::GetFlag(FLAGS_wire_dtype);
  c.compress = absl::GetFlag(FLAGS_compress);
  c.exchange = absl::GetFlag(FLAGS_exchange);
  c.transport = absl::GetFlag(FLAGS_transport);
  c.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  c.timeline = absl::GetFlag(FLAGS_timeline);
  c.result_json = absl::GetFlag(FLAGS_result_json);
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

// A flag not on the command line (nor in a --flagfile) takes the variable
// asyncps.run sets, as the Python client does: so one command line runs
// under the launcher, on any host, and elsewhere with the flags given.
template <typename T>
absl::Status FromLauncher(const absl::Flag<T>& flag, const char* variable,
                          T* value) {
  // CommandLineFlag::IsSpecifiedOnCommandLine is private in Abseil
  // 20220623; this is what it answers from.
  if (absl::flags_internal::WasPresentOnCommandLine(
          absl::GetFlagReflectionHandle(flag).Name())) {
    return absl::OkStatus();
  }
  const char* text = std::getenv(variable);
  if (text == nullptr || *text == '\0') return absl::OkStatus();
  std::string error;
  if (!absl::ParseFlag(text, value, &error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("$", variable, "='", text, "' is not a valid --",
                     absl::GetFlagReflectionHandle(flag).Name(),
                     error.empty() ? "" : ": ", error));
  }
  return absl::OkStatus();
}

absl::StatusOr<WorkerFlags> FlagsWithLauncher() {
  WorkerFlags c = FlagsFromCommandLine();
  for (absl::Status s :
       {FromLauncher(FLAGS_servers, "ASYNCPS_SERVERS", &c.servers),
        FromLauncher(FLAGS_rank, "ASYNCPS_RANK", &c.rank),
        FromLauncher(FLAGS_num_workers, "ASYNCPS_NUM_WORKERS", &c.num_workers),
        FromLauncher(FLAGS_mode, "ASYNCPS_MODE", &c.mode)}) {
    if (!s.ok()) return s;
  }
  return c;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  asyncps::InitProgramFlags(
      "ps_worker",
      "Trains through the asyncps parameter servers, or evaluates.\n"
      "  ps_worker --servers=h:p,h:p --rank=0 --num_workers=2\n"
      "  ps_worker --servers=h:p,h:p --role=evaluator --curve=curve.csv");
  absl::ParseCommandLine(argc, argv);
  asyncps::KeepLargeBuffers();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  const absl::StatusOr<asyncps::WorkerFlags> flags =
      asyncps::FlagsWithLauncher();
  if (!flags.ok()) return asyncps::Fail(flags.status(), 2);
  const absl::StatusOr<asyncps::WorkerConfig> config =
      asyncps::WorkerConfig::Parse(*flags);
  if (!config.ok()) return asyncps::Fail(config.status(), 2);

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
      asyncps::RunWorker(*config, &stop, &stopped, &refused_at_start);
  asyncps::WakeStopWaiter();
  watcher.join();
  return s.ok() ? 0 : asyncps::Fail(s, refused_at_start ? 2 : 1);
}
