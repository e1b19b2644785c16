// WorkerFlags and WorkerConfig: what ps_worker is told on its command line.
// WorkerFlags holds the flags as given; WorkerConfig::Parse checks all of
// them at once, before the worker touches a device, a file or the network,
// and parses each once into a typed value (an enum, a server list, an
// optimizer spec). Neither knows the client nor gRPC: the client's options
// are built from a WorkerConfig where the client is (worker/worker_run.cc).
// worker_config_test checks it in-process.
#ifndef ASYNCPS_WORKER_WORKER_CONFIG_H_
#define ASYNCPS_WORKER_WORKER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/cluster_spec.h"
#include "common/compress.h"
#include "common/mode.h"
#include "common/security.h"
#include "common/transport_kind.h"
#include "proto/asyncps.pb.h"
#include "worker/exchange_mode.h"
#include "worker/gemm_precision.h"

namespace asyncps {

// The flags as the command line gives them (ps_worker_main.cc fills it from
// the absl flags); the defaults are the flags'.
struct WorkerFlags {
  std::string role = "worker";  // worker or evaluator.
  std::string servers = "127.0.0.1:5000";
  int rank = 0;
  int num_workers = 1;
  std::string mode = "async";
  double slowdown = 1.0;
  std::string collective = "auto";
  std::string collective_host = "127.0.0.1";
  absl::Duration collective_timeout = absl::Seconds(30);
  int64_t assign_every = 50;
  std::string device = "auto";
  std::string precision = "fp32";
  std::string layers = "784,256,128,10";
  std::string optimizer = "momentum";
  double lr = 0.02;
  double momentum = 0.9;
  double weight_decay = 0.0;
  double lr_decay = 0.0;
  std::string outer = "none";  // --outer: none, diloco, easgd.
  int local_steps = 1;
  bool dynamic_local_steps = false;
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  double alpha = 0.0;  // 0: 0.9 / num_workers.
  int batch_size = 64;
  int accumulate = 1;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t stop_at_version = 0;
  uint64_t seed = 1;
  uint64_t slice_bytes = 4 << 20;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  int64_t max_train_examples = 0;
  int64_t max_test_examples = 0;
  absl::Duration log_every = absl::Seconds(5);
  absl::Duration eval_every = absl::Seconds(5);
  bool eval_once = false;
  bool until_done = false;
  std::string curve;
  int blas_threads = 1;
  absl::Duration rpc_timeout = absl::Seconds(30);
  absl::Duration retry_for = absl::Seconds(60);
  absl::Duration heartbeat_every = absl::Seconds(1);
  std::string wire_dtype = "f32";
  std::string compress = "none";  // --compress (common/compress.h).
  std::string exchange = "fused";
  std::string transport = "tcp";
  int metrics_port = 0;
  std::string timeline;
  std::string result_json;
  SecurityFlags security;  // TLS and token files (common/security.h).
};

// --role.
enum class WorkerRole { kWorker, kEvaluator };

// --collective: allreduce's collective among the workers.
enum class CollectiveChoice {
  kAuto,  // NCCL when the worker runs on a GPU, else gloo.
  kGloo,
  kNccl,
};

// --device.
struct DeviceChoice {
  enum Kind { kAuto, kCpu, kCuda };
  Kind kind = kAuto;
  int cuda_index = 0;  // kCuda: the GPU's index.

  // "auto", "cpu" or "cuda:N", as --device takes it.
  std::string Name() const;
};

// The flags parsed, each into its type. Built by Parse; the plain values
// (numbers, durations, paths) are the flags' as given.
struct WorkerConfig {
  // The flags checked and parsed, or INVALID_ARGUMENT / FAILED_PRECONDITION
  // whose message names the first flag that is wrong (--mode=eventual,
  // --rank=2, ...) and, for a choice, the values it takes.
  static absl::StatusOr<WorkerConfig> Parse(const WorkerFlags& flags);

  WorkerRole role = WorkerRole::kWorker;
  std::vector<ServerAddress> servers;  // Shard i is servers[i].
  int rank = 0;                        // -1: the servers assign one.
  int num_workers = 1;
  Mode mode = Mode::kAsync;
  double slowdown = 1.0;
  CollectiveChoice collective = CollectiveChoice::kAuto;
  std::string collective_host;
  absl::Duration collective_timeout;
  int64_t assign_every = 0;
  DeviceChoice device;
  GemmPrecision precision = GemmPrecision::kFp32;
  std::vector<int> layers;  // Input first, classes last.
  // --optimizer with --lr, --momentum, --weight_decay and --lr_decay: the
  // servers' optimizer, or with --outer the worker's inner one.
  v1::OptimizerSpec optimizer;
  // --outer and its flags; `outer.optimizer` is what the model is declared
  // with when `outer.kind` is not kNone.
  struct Outer {
    enum Kind { kNone, kDiloco, kEasgd };
    Kind kind = kNone;
    int local_steps = 1;
    bool dynamic = false;  // --dynamic_local_steps.
    v1::OptimizerSpec optimizer;
    float alpha = 0.0f;  // kEasgd.
  };
  Outer outer;
  int batch_size = 0;
  int accumulate = 1;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t stop_at_version = 0;
  uint64_t seed = 1;
  uint64_t slice_bytes = 0;
  std::string data_dir;
  int64_t max_train_examples = 0;
  int64_t max_test_examples = 0;
  absl::Duration log_every;
  absl::Duration eval_every;
  bool eval_once = false;
  // Evaluator: score the final model once every worker has finished, then
  // exit (the shards' Stats say when).
  bool until_done = false;
  std::string curve;
  int blas_threads = 1;
  absl::Duration rpc_timeout;
  absl::Duration retry_for;
  absl::Duration heartbeat_every;
  v1::DType wire_dtype = v1::DTYPE_F32;
  Compression compress;
  ExchangeMode exchange = ExchangeMode::kFused;  // As --exchange says.
  Transport transport = Transport::kTcp;
  int metrics_port = 0;  // Prometheus' /metrics; 0: none.
  std::string timeline;  // Chrome trace-event file; empty: none.
  // The result (as the "rank R done:" line says it) as JSON, written
  // atomically at the end; empty: none.
  std::string result_json;
  SecurityFlags security;

  bool evaluator() const { return role == WorkerRole::kEvaluator; }
  // The exchange the worker runs: --exchange's in async; layered in ssp,
  // bsp (and allreduce, where it does not apply).
  ExchangeMode Exchange() const;
  // allreduce: the collective to use on `cuda_device` (-1: the CPU),
  // "gloo" or "nccl".
  std::string CollectiveKind(int cuda_device) const;
};

// --outer and its flags for `mode`, or INVALID_ARGUMENT naming the bad one:
// the servers' optimizer (diloco: momentum with nesterov in bsp,
// delayed_nesterov with delay --num_workers in async and ssp; easgd:
// elastic, async and ssp only; none in allreduce).
absl::StatusOr<WorkerConfig::Outer> OuterFromFlags(const WorkerFlags& flags,
                                                   Mode mode);

// The optimizer of --optimizer and its hyper-parameter flags, or
// INVALID_ARGUMENT naming the bad one.
absl::StatusOr<v1::OptimizerSpec> OptimizerFromFlags(const WorkerFlags& flags);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_WORKER_CONFIG_H_
