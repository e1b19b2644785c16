#include "worker/worker_config.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/optimizer.h"
#include "common/partitioner.h"  // kMaxRank
#include "common/status.h"
#include "common/wire_dtype.h"
#include "worker/device.h"
#include "worker/model/mlp.h"

namespace asyncps {
namespace {

absl::StatusOr<WorkerRole> ParseRole(const std::string& text) {
  if (text == "worker") return WorkerRole::kWorker;
  if (text == "evaluator") return WorkerRole::kEvaluator;
  return absl::InvalidArgumentError(
      absl::StrCat("--role=", text, " (want worker or evaluator)"));
}

absl::StatusOr<CollectiveChoice> ParseCollective(const std::string& text) {
  if (text == "auto") return CollectiveChoice::kAuto;
  if (text == "gloo") return CollectiveChoice::kGloo;
  if (text == "nccl") return CollectiveChoice::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("--collective=", text, " (want auto, gloo or nccl)"));
}

absl::StatusOr<DeviceChoice> ParseDeviceChoice(const std::string& text) {
  ASSIGN_OR_RETURN(const int device, ParseDevice(text));
  DeviceChoice d;
  if (device == -1) d.kind = DeviceChoice::kCpu;
  if (device >= 0) d.kind = DeviceChoice::kCuda, d.cuda_index = device;
  return d;
}

// The checks of the plain numbers, in the order Parse runs them.
absl::Status CheckCounts(const WorkerFlags& f) {
  if (!(f.slowdown >= 1.0)) {
    return absl::InvalidArgumentError("--slowdown must be >= 1");
  }
  // A rank at or past --num_workers is the servers' to refuse (an elastic
  // job, ps_server --elastic, takes one).
  if (f.num_workers < 1 || f.rank < -1 || f.rank >= kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank=", f.rank, " must be in [0, ", kMaxRank,
        "), or -1 (the servers assign one); --num_workers=", f.num_workers,
        " must be >= 1"));
  }
  if (f.batch_size < 1 || f.batch_size > 65536) {
    return absl::InvalidArgumentError("--batch_size must be in [1, 65536]");
  }
  if (f.accumulate < 1) {
    return absl::InvalidArgumentError("--accumulate must be >= 1");
  }
  if (f.epochs < 1) return absl::InvalidArgumentError("--epochs must be >= 1");
  return absl::OkStatus();
}

absl::Status CheckPortThreadsAndPeriods(const WorkerFlags& f) {
  if (f.metrics_port < 0 || f.metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_port=", f.metrics_port, " is not a TCP port (0: none)"));
  }
  if (f.blas_threads < 1) {
    return absl::InvalidArgumentError("--blas_threads must be >= 1");
  }
  for (const auto& [name, d] :
       {std::pair<const char*, absl::Duration>{"--rpc_timeout", f.rpc_timeout},
        {"--heartbeat_every", f.heartbeat_every},
        {"--collective_timeout", f.collective_timeout},
        {"--eval_every", f.eval_every}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be positive"));
    }
  }
  return absl::OkStatus();
}

// allreduce's ring compresses to f16 only, and with gloo only.
absl::Status CheckAllreduceCompression(const WorkerFlags& f) {
  if (f.mode == "allreduce" && f.compress != "none" && f.compress != "f16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--compress=", f.compress,
        " with --mode=allreduce: the ring compresses to f16 only (Horovod's "
        "fp16 compression); top-k, one-bit and bf16 go to the servers"));
  }
  if (f.mode == "allreduce" && f.compress == "f16" && f.collective == "nccl") {
    return absl::InvalidArgumentError(
        "--compress=f16 with --collective=nccl is not built (gloo only)");
  }
  return absl::OkStatus();
}

// The values taken as given.
void CopyPlain(const WorkerFlags& f, WorkerConfig* c) {
  c->rank = f.rank;
  c->num_workers = f.num_workers;
  c->slowdown = f.slowdown;
  c->collective_host = f.collective_host;
  c->collective_timeout = f.collective_timeout;
  c->assign_every = f.assign_every;
  c->batch_size = f.batch_size;
  c->accumulate = f.accumulate;
  c->epochs = f.epochs;
  c->steps = f.steps;
  c->stop_at_version = f.stop_at_version;
  c->seed = f.seed;
  c->slice_bytes = f.slice_bytes;
  c->data_dir = f.data_dir;
  c->max_train_examples = f.max_train_examples;
  c->max_test_examples = f.max_test_examples;
  c->log_every = f.log_every;
  c->eval_every = f.eval_every;
  c->eval_once = f.eval_once;
  c->until_done = f.until_done;
  c->curve = f.curve;
  c->blas_threads = f.blas_threads;
  c->rpc_timeout = f.rpc_timeout;
  c->retry_for = f.retry_for;
  c->heartbeat_every = f.heartbeat_every;
  c->metrics_port = f.metrics_port;
  c->timeline = f.timeline;
  c->result_json = f.result_json;
  c->security = f.security;
}

}  // namespace

std::string DeviceChoice::Name() const {
  switch (kind) {
    case kCpu:
      return "cpu";
    case kCuda:
      return absl::StrCat("cuda:", cuda_index);
    default:
      return "auto";
  }
}

absl::StatusOr<v1::OptimizerSpec> OptimizerFromFlags(const WorkerFlags& flags) {
  v1::OptimizerSpec o;
  const std::string& name = flags.optimizer;
  if (name == "sgd") {
    o.set_kind(v1::OptimizerSpec::SGD);
  } else if (name == "momentum" || name == "nesterov") {
    o.set_kind(v1::OptimizerSpec::MOMENTUM);
    o.set_momentum(static_cast<float>(flags.momentum));
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
  o.set_learning_rate(static_cast<float>(flags.lr));
  o.set_weight_decay(static_cast<float>(flags.weight_decay));
  o.set_lr_decay(static_cast<float>(flags.lr_decay));
  RETURN_IF_ERROR(ValidateOptimizer(o));
  return o;
}

absl::StatusOr<WorkerConfig::Outer> OuterFromFlags(const WorkerFlags& f,
                                                   Mode mode) {
  WorkerConfig::Outer o;
  if (f.dynamic_local_steps && (f.outer != "diloco" || mode != Mode::kAsync)) {
    return absl::InvalidArgumentError(
        "--dynamic_local_steps is asynchronous DiLoCo's: --outer=diloco "
        "--mode=async (ssp's bound and bsp's steps count rounds)");
  }
  if (f.outer == "none") return o;
  if (f.outer != "diloco" && f.outer != "easgd") {
    return absl::InvalidArgumentError(
        absl::StrCat("--outer=", f.outer, " (want none, diloco, easgd)"));
  }
  if (f.local_steps < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local_steps=", f.local_steps, " (must be >= 1)"));
  }
  if (mode == Mode::kAllreduce || (f.outer == "easgd" && mode == Mode::kBsp)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--outer=", f.outer, " runs in ",
        f.outer == "easgd" ? "async and ssp" : "async, ssp and bsp",
        ", not --mode=", ModeName(mode)));
  }
  o.local_steps = f.local_steps;
  o.dynamic = f.dynamic_local_steps;
  if (f.outer == "easgd") {
    o.kind = WorkerConfig::Outer::kEasgd;
    o.alpha = static_cast<float>(
        f.alpha == 0.0 ? 0.9 / std::max(1, f.num_workers) : f.alpha);
    o.optimizer.set_kind(v1::OptimizerSpec::ELASTIC);
    o.optimizer.set_learning_rate(o.alpha);
  } else {
    o.kind = WorkerConfig::Outer::kDiloco;
    o.optimizer.set_learning_rate(static_cast<float>(f.outer_lr));
    o.optimizer.set_momentum(static_cast<float>(f.outer_momentum));
    if (mode == Mode::kBsp) {
      o.optimizer.set_kind(v1::OptimizerSpec::MOMENTUM);
      o.optimizer.set_nesterov(true);
    } else {
      o.optimizer.set_kind(v1::OptimizerSpec::DELAYED_NESTEROV);
      o.optimizer.set_delay(std::max(1, f.num_workers));
    }
    if (!(f.outer_lr > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--outer_lr=", f.outer_lr, " (must be > 0)"));
    }
  }
  absl::Status valid = ValidateOptimizer(o.optimizer);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--outer=", f.outer,
        " (--outer_lr, --outer_momentum, --alpha): ", valid.message()));
  }
  return o;
}

absl::StatusOr<WorkerConfig> WorkerConfig::Parse(const WorkerFlags& f) {
  WorkerConfig c;
  ASSIGN_OR_RETURN(c.role, ParseRole(f.role));
  if (f.until_done && (!c.evaluator() || f.eval_once)) {
    return absl::InvalidArgumentError(
        "--until_done is for --role=evaluator without --eval_once");
  }
  ASSIGN_OR_RETURN(c.mode, ParseMode(f.mode));
  RETURN_IF_ERROR(CheckCounts(f));
  ASSIGN_OR_RETURN(c.collective, ParseCollective(f.collective));
  RETURN_IF_ERROR(CheckPortThreadsAndPeriods(f));
  absl::StatusOr<std::vector<ServerAddress>> servers =
      ParseServerList(f.servers);
  if (!servers.ok()) return Annotate(servers.status(), "--servers");
  c.servers = *std::move(servers);
  ASSIGN_OR_RETURN(c.layers, ParseLayers(f.layers));
  ASSIGN_OR_RETURN(c.optimizer, OptimizerFromFlags(f));
  ASSIGN_OR_RETURN(c.outer, OuterFromFlags(f, c.mode));
  ASSIGN_OR_RETURN(c.precision, ParsePrecision(f.precision));
  ASSIGN_OR_RETURN(c.wire_dtype, ParseWireDtype(f.wire_dtype));
  ASSIGN_OR_RETURN(c.compress, ParseCompression(f.compress));
  RETURN_IF_ERROR(CheckAllreduceCompression(f));
  ASSIGN_OR_RETURN(c.exchange, ParseExchangeMode(f.exchange));
  ASSIGN_OR_RETURN(c.transport, ParseTransport(f.transport));
  ASSIGN_OR_RETURN(c.device, ParseDeviceChoice(f.device));
  CopyPlain(f, &c);
  return c;
}

ExchangeMode WorkerConfig::Exchange() const {
  return mode == Mode::kAsync ? exchange : ExchangeMode::kLayered;
}

std::string WorkerConfig::CollectiveKind(int cuda_device) const {
  switch (collective) {
    case CollectiveChoice::kGloo:
      return "gloo";
    case CollectiveChoice::kNccl:
      return "nccl";
    default:
      return cuda_device >= 0 ? "nccl" : "gloo";
  }
}

}  // namespace asyncps
