// WorkerConfig: everything ps_worker is told on its command line, as plain
// values, and the one check of all of them (Validate) that runs before the
// worker touches a device, a file or the network. The flags test checks it
// in-process.
#ifndef ASYNCPS_WORKER_WORKER_CONFIG_H_
#define ASYNCPS_WORKER_WORKER_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/mode.h"
#include "common/security.h"
#include "proto/asyncps.pb.h"
#include "worker/gemm_precision.h"
#include "worker/ps_exchange.h"

namespace asyncps {

struct WorkerConfig {
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
  // Evaluator: score the final model once every worker has finished, then
  // exit (the shards' Stats say when).
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
  int metrics_port = 0;  // Prometheus' /metrics; 0: none.
  std::string timeline;  // Chrome trace-event file; empty: none.
  // The result (as the "rank R done:" line says it) as JSON, written
  // atomically at the end; empty: none.
  std::string result_json;
  SecurityFlags security;  // TLS and token files (common/security.h).

  // OK, or INVALID_ARGUMENT / FAILED_PRECONDITION whose message names the
  // flag that is wrong (--mode=eventual, --rank=2, ...).
  absl::Status Validate() const;

  // Parsed values. REQUIRES: Validate().ok().
  bool evaluator() const { return role == "evaluator"; }
  Mode ParsedMode() const;
  std::vector<ServerAddress> ServerList() const;
  std::vector<int> Layers() const;
  GemmPrecision Precision() const;
  v1::OptimizerSpec Optimizer() const;
  v1::DType WireDtype() const;
  Transport TensorTransport() const;
  // The exchange --exchange asks for; layered in ssp, bsp (and allreduce,
  // where it does not apply).
  PsExchange::Mode Exchange() const;
  // allreduce: the collective to use on `cuda_device` (-1: the CPU).
  std::string CollectiveKind(int cuda_device) const;
};

// The optimizer of --optimizer and its hyper-parameter flags, or
// INVALID_ARGUMENT naming the bad one.
absl::StatusOr<v1::OptimizerSpec> OptimizerFromConfig(
    const WorkerConfig& config);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_WORKER_CONFIG_H_
