#include "worker/worker_config.h"

#include "absl/strings/str_cat.h"
#include "common/compress.h"
#include "common/optimizer.h"
#include "common/status.h"
#include "common/wire_dtype.h"
#include "worker/device.h"
#include "worker/model/mlp.h"

namespace asyncps {
absl::StatusOr<v1::OptimizerSpec> OptimizerFromConfig(
    const WorkerConfig& config) {
  v1::OptimizerSpec o;
  const std::string& name = config.optimizer;
  if (name == "sgd") {
    o.set_kind(v1::OptimizerSpec::SGD);
  } else if (name == "momentum" || name == "nesterov") {
    o.set_kind(v1::OptimizerSpec::MOMENTUM);
    o.set_momentum(static_cast<float>(config.momentum));
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
  o.set_learning_rate(static_cast<float>(config.lr));
  o.set_weight_decay(static_cast<float>(config.weight_decay));
  o.set_lr_decay(static_cast<float>(config.lr_decay));
  RETURN_IF_ERROR(ValidateOptimizer(o));
  return o;
}

absl::Status WorkerConfig::Validate() const {
  if (role != "worker" && role != "evaluator") {
    return absl::InvalidArgumentError(
        absl::StrCat("--role=", role, " (want worker or evaluator)"));
  }
  if (until_done && (role != "evaluator" || eval_once)) {
    return absl::InvalidArgumentError(
        "--until_done is for --role=evaluator without --eval_once");
  }
  RETURN_IF_ERROR(ParseMode(mode).status());
  if (!(slowdown >= 1.0)) {
    return absl::InvalidArgumentError("--slowdown must be >= 1");
  }
  if (num_workers < 1 || rank < -1 || rank >= num_workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--rank=", rank, " must be in [0, --num_workers=", num_workers,
        "), or -1 (the servers assign one)"));
  }
  if (batch_size < 1 || batch_size > 65536) {
    return absl::InvalidArgumentError("--batch_size must be in [1, 65536]");
  }
  if (accumulate < 1) {
    return absl::InvalidArgumentError("--accumulate must be >= 1");
  }
  if (epochs < 1) return absl::InvalidArgumentError("--epochs must be >= 1");
  if (collective != "auto" && collective != "gloo" && collective != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--collective=", collective, " (want auto, gloo or nccl)"));
  }
  if (metrics_port < 0 || metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_port=", metrics_port, " is not a TCP port (0: none)"));
  }
  if (blas_threads < 1) {
    return absl::InvalidArgumentError("--blas_threads must be >= 1");
  }
  for (const auto& [name, d] :
       {std::pair<const char*, absl::Duration>{"--rpc_timeout", rpc_timeout},
        {"--heartbeat_every", heartbeat_every},
        {"--collective_timeout", collective_timeout},
        {"--eval_every", eval_every}}) {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, " must be positive"));
    }
  }
  RETURN_IF_ERROR(Annotate(ParseServerList(servers).status(), "--servers"));
  RETURN_IF_ERROR(ParseLayers(layers).status());
  RETURN_IF_ERROR(OptimizerFromConfig(*this).status());
  RETURN_IF_ERROR(ParsePrecision(precision).status());
  RETURN_IF_ERROR(ParseWireDtype(wire_dtype).status());
  RETURN_IF_ERROR(ParseCompression(compress).status());
  if (mode == "allreduce" && compress != "none" && compress != "f16") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--compress=", compress,
        " with --mode=allreduce: the ring compresses to f16 only (Horovod's "
        "fp16 compression); top-k, one-bit and bf16 go to the servers"));
  }
  if (mode == "allreduce" && compress == "f16" && collective == "nccl") {
    return absl::InvalidArgumentError(
        "--compress=f16 with --collective=nccl is not built (gloo only)");
  }
  RETURN_IF_ERROR(PsExchange::ParseMode(exchange).status());
  RETURN_IF_ERROR(ParseTransport(transport).status());
  return ParseDevice(device).status();
}

Mode WorkerConfig::ParsedMode() const { return *ParseMode(mode); }

std::vector<ServerAddress> WorkerConfig::ServerList() const {
  return *ParseServerList(servers);
}

std::vector<int> WorkerConfig::Layers() const { return *ParseLayers(layers); }

GemmPrecision WorkerConfig::Precision() const {
  return *ParsePrecision(precision);
}

v1::OptimizerSpec WorkerConfig::Optimizer() const {
  return *OptimizerFromConfig(*this);
}

v1::DType WorkerConfig::WireDtype() const {
  return *ParseWireDtype(wire_dtype);
}

Transport WorkerConfig::TensorTransport() const {
  return *ParseTransport(transport);
}

PsExchange::Mode WorkerConfig::Exchange() const {
  if (ParsedMode() != Mode::kAsync) return PsExchange::Mode::kLayered;
  return *PsExchange::ParseMode(exchange);
}

std::string WorkerConfig::CollectiveKind(int cuda_device) const {
  if (collective != "auto") return collective;
  return cuda_device >= 0 ? "nccl" : "gloo";
}

}  // namespace asyncps
