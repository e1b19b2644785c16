// WorkerConfig::Parse in-process: every bad flag is refused with a message
// naming it (and, for a choice, the values it takes), before the worker
// touches a device, a file or the network; good flags come out typed.
#include "worker/worker_config.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device.h"

namespace asyncps {
namespace {

TEST(WorkerConfig, DefaultsAreValid) {
  const absl::StatusOr<WorkerConfig> config = WorkerConfig::Parse({});
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->role, WorkerRole::kWorker);
  EXPECT_FALSE(config->evaluator());
  EXPECT_EQ(config->mode, Mode::kAsync);
  ASSERT_EQ(config->servers.size(), 1u);
  EXPECT_EQ(config->servers[0].ToString(), "127.0.0.1:5000");
  EXPECT_EQ(config->layers, (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(config->optimizer.kind(), v1::OptimizerSpec::MOMENTUM);
  EXPECT_FLOAT_EQ(config->optimizer.learning_rate(), 0.02f);
  EXPECT_FLOAT_EQ(config->optimizer.momentum(), 0.9f);
  EXPECT_EQ(config->collective, CollectiveChoice::kAuto);
  EXPECT_EQ(config->CollectiveKind(-1), "gloo");
  EXPECT_EQ(config->CollectiveKind(0), "nccl");
  EXPECT_EQ(config->device.kind, DeviceChoice::kAuto);
  EXPECT_EQ(config->device.Name(), "auto");
  EXPECT_EQ(config->precision, GemmPrecision::kFp32);
  EXPECT_EQ(config->wire_dtype, v1::DTYPE_F32);
  EXPECT_EQ(config->compress.kind, Compression::kNone);
  EXPECT_EQ(config->transport, Transport::kTcp);
  EXPECT_EQ(config->exchange, ExchangeMode::kFused);
  EXPECT_EQ(config->Exchange(), ExchangeMode::kFused);
  EXPECT_EQ(config->rpc_timeout, absl::Seconds(30));
  EXPECT_EQ(config->heartbeat_every, absl::Seconds(1));
}

TEST(WorkerConfig, FlagsComeOutTyped) {
  WorkerFlags flags;
  flags.role = "evaluator";
  flags.servers = "a:1,b:2|c:3";
  flags.mode = "allreduce";
  flags.collective = "gloo";
  flags.device = "cpu";
  flags.layers = "10,3";
  flags.optimizer = "nesterov";
  flags.lr = 0.5;
  flags.wire_dtype = "bf16";
  flags.compress = "f16";
  flags.exchange = "prefetch";
  flags.transport = "grpc";
  flags.rank = -1;
  flags.num_workers = 4;
  flags.log_every = absl::Milliseconds(250);
  const absl::StatusOr<WorkerConfig> config = WorkerConfig::Parse(flags);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_TRUE(config->evaluator());
  EXPECT_EQ(config->mode, Mode::kAllreduce);
  ASSERT_EQ(config->servers.size(), 2u);
  EXPECT_EQ(config->servers[1].ToString(), "b:2");
  ASSERT_EQ(config->servers[1].others.size(), 1u);
  EXPECT_EQ(config->servers[1].others[0].ToString(), "c:3");
  EXPECT_EQ(config->collective, CollectiveChoice::kGloo);
  EXPECT_EQ(config->CollectiveKind(0), "gloo");
  EXPECT_EQ(config->device.kind, DeviceChoice::kCpu);
  EXPECT_EQ(config->device.Name(), "cpu");
  EXPECT_EQ(config->layers, (std::vector<int>{10, 3}));
  EXPECT_TRUE(config->optimizer.nesterov());
  EXPECT_FLOAT_EQ(config->optimizer.learning_rate(), 0.5f);
  EXPECT_EQ(config->wire_dtype, v1::DTYPE_BF16);
  EXPECT_EQ(config->compress.kind, Compression::kF16);
  EXPECT_EQ(config->transport, Transport::kGrpc);
  EXPECT_EQ(config->exchange, ExchangeMode::kPrefetch);
  EXPECT_EQ(config->Exchange(), ExchangeMode::kLayered);  // Not async.
  EXPECT_EQ(config->rank, -1);
  EXPECT_EQ(config->num_workers, 4);
  EXPECT_EQ(config->log_every, absl::Milliseconds(250));
}

TEST(WorkerConfig, OnlyAsyncFusesItsExchange) {
  WorkerFlags flags;
  flags.exchange = "prefetch";
  EXPECT_EQ(WorkerConfig::Parse(flags)->Exchange(), ExchangeMode::kPrefetch);
  for (const char* mode : {"ssp", "bsp"}) {
    flags.mode = mode;
    const absl::StatusOr<WorkerConfig> config = WorkerConfig::Parse(flags);
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->Exchange(), ExchangeMode::kLayered) << mode;
  }
}

TEST(WorkerConfig, BadFlagsAreRefusedNamingThem) {
  struct Case {
    std::function<void(WorkerFlags*)> set;
    std::string words;
  };
  const std::vector<Case> cases = {
      {[](WorkerFlags* c) { c->role = "trainer"; }, "--role=trainer"},
      {[](WorkerFlags* c) { c->mode = "eventual"; }, "eventual"},
      {[](WorkerFlags* c) { c->device = "tpu:0"; }, "--device=tpu:0"},
      {[](WorkerFlags* c) { c->device = "cuda:x"; }, "--device=cuda:x"},
      {[](WorkerFlags* c) { c->precision = "fp8"; }, "--precision=fp8"},
      {[](WorkerFlags* c) { c->layers = "784,x,10"; }, "--layers"},
      {[](WorkerFlags* c) { c->optimizer = "lion"; }, "--optimizer=lion"},
      {[](WorkerFlags* c) { c->lr = -1; }, "learning_rate"},
      {[](WorkerFlags* c) { c->servers = "nohostport"; }, "--servers"},
      {[](WorkerFlags* c) { c->rank = 1 << 16; }, "--rank=65536"},
      {[](WorkerFlags* c) { c->rank = -2; }, "--rank=-2"},
      {[](WorkerFlags* c) { c->num_workers = 0; }, "--num_workers=0"},
      {[](WorkerFlags* c) { c->slowdown = 0.5; }, "--slowdown"},
      {[](WorkerFlags* c) { c->until_done = true; }, "--until_done"},
      {[](WorkerFlags* c) {
         c->role = "evaluator", c->until_done = c->eval_once = true;
       },
       "--until_done"},
      {[](WorkerFlags* c) { c->batch_size = 0; }, "--batch_size"},
      {[](WorkerFlags* c) { c->batch_size = 1 << 20; }, "--batch_size"},
      {[](WorkerFlags* c) { c->accumulate = 0; }, "--accumulate"},
      {[](WorkerFlags* c) { c->epochs = 0; }, "--epochs"},
      {[](WorkerFlags* c) { c->collective = "mpi"; }, "--collective=mpi"},
      {[](WorkerFlags* c) { c->blas_threads = 0; }, "--blas_threads"},
      {[](WorkerFlags* c) { c->wire_dtype = "fp8"; }, "--wire_dtype=fp8"},
      {[](WorkerFlags* c) { c->exchange = "gossip"; }, "--exchange=gossip"},
      {[](WorkerFlags* c) { c->compress = "topk:2"; }, "--compress=topk:2"},
      {[](WorkerFlags* c) { c->mode = "allreduce", c->compress = "topk:0.01"; },
       "f16 only"},
      {[](WorkerFlags* c) {
         c->mode = "allreduce", c->compress = "f16", c->collective = "nccl";
       },
       "--collective=nccl"},
      {[](WorkerFlags* c) { c->rpc_timeout = absl::ZeroDuration(); },
       "--rpc_timeout"},
      {[](WorkerFlags* c) { c->heartbeat_every = absl::Seconds(-1); },
       "--heartbeat_every"},
  };
  for (const Case& c : cases) {
    WorkerFlags flags;
    c.set(&flags);
    const absl::StatusOr<WorkerConfig> config = WorkerConfig::Parse(flags);
    EXPECT_FALSE(config.ok()) << c.words;
    EXPECT_NE(config.status().message().find(c.words), absl::string_view::npos)
        << c.words << ": " << config.status();
  }
}

// A choice's bad value: INVALID_ARGUMENT naming the flag, the value and
// every value the flag takes.
TEST(WorkerConfig, BadChoiceNamesTheFlagAndTheValuesItTakes) {
  struct Case {
    std::function<void(WorkerFlags*)> set;
    std::string flag;
    std::vector<std::string> allowed;
  };
  const std::vector<Case> cases = {
      {[](WorkerFlags* c) { c->role = "x"; },
       "--role=x",
       {"worker", "evaluator"}},
      {[](WorkerFlags* c) { c->mode = "x"; },
       "--mode=x",
       {"async", "ssp", "bsp", "allreduce"}},
      {[](WorkerFlags* c) { c->collective = "x"; },
       "--collective=x",
       {"auto", "gloo", "nccl"}},
      {[](WorkerFlags* c) { c->device = "x"; },
       "--device=x",
       {"auto", "cpu", "cuda:N"}},
      {[](WorkerFlags* c) { c->precision = "x"; },
       "--precision=x",
       {"fp32", "tf32", "bf16"}},
      {[](WorkerFlags* c) { c->optimizer = "x"; },
       "--optimizer=x",
       {"sgd", "momentum", "nesterov", "adam", "adagrad"}},
      {[](WorkerFlags* c) { c->wire_dtype = "x"; },
       "--wire_dtype=x",
       {"f32", "bf16", "f16"}},
      {[](WorkerFlags* c) { c->compress = "x"; },
       "--compress=x",
       {"none", "bf16", "f16", "topk:RATIO", "onebit"}},
      {[](WorkerFlags* c) { c->exchange = "x"; },
       "--exchange=x",
       {"layered", "fused", "prefetch"}},
      {[](WorkerFlags* c) { c->transport = "x"; },
       "--transport=x",
       {"tcp", "grpc"}},
      {[](WorkerFlags* c) { c->outer = "x"; },
       "--outer=x",
       {"none", "diloco", "easgd"}},
  };
  for (const Case& c : cases) {
    WorkerFlags flags;
    c.set(&flags);
    const absl::StatusOr<WorkerConfig> config = WorkerConfig::Parse(flags);
    ASSERT_FALSE(config.ok()) << c.flag;
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument)
        << config.status();
    const absl::string_view message = config.status().message();
    EXPECT_NE(message.find(c.flag), absl::string_view::npos)
        << c.flag << ": " << message;
    for (const std::string& value : c.allowed) {
      EXPECT_NE(message.find(value), absl::string_view::npos)
          << c.flag << " does not name " << value << ": " << message;
    }
  }
}

// --outer (docs/MODES.md "Outer optimizers"): the servers' optimizer each
// choice declares, and the configurations refused, each naming its flag.
TEST(WorkerConfig, OuterOptimizerFlags) {
  WorkerFlags f;
  f.outer = "diloco";
  f.local_steps = 8;
  f.num_workers = 4;
  auto c = WorkerConfig::Parse(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->outer.kind, WorkerConfig::Outer::kDiloco);
  EXPECT_EQ(c->outer.local_steps, 8);
  EXPECT_EQ(c->outer.optimizer.kind(), v1::OptimizerSpec::DELAYED_NESTEROV);
  EXPECT_EQ(c->outer.optimizer.delay(), 4);
  EXPECT_FLOAT_EQ(c->outer.optimizer.learning_rate(), 0.7f);
  EXPECT_EQ(c->optimizer.kind(), v1::OptimizerSpec::MOMENTUM);  // Inner.
  f.mode = "bsp";
  c = WorkerConfig::Parse(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->outer.optimizer.kind(), v1::OptimizerSpec::MOMENTUM);
  EXPECT_TRUE(c->outer.optimizer.nesterov());
  f.mode = "async";
  f.outer = "easgd";
  c = WorkerConfig::Parse(f);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->outer.optimizer.kind(), v1::OptimizerSpec::ELASTIC);
  EXPECT_FLOAT_EQ(c->outer.alpha, 0.9f / 4);
  const struct {
    void (*set)(WorkerFlags*);
    const char* words;
  } bad[] = {
      {[](WorkerFlags* f) { f->local_steps = 0; }, "--local_steps=0"},
      {[](WorkerFlags* f) { f->mode = "bsp"; }, "not --mode=bsp"},
      {[](WorkerFlags* f) { f->mode = "allreduce"; }, "not --mode=allreduce"},
      {[](WorkerFlags* f) { f->alpha = 1.0; }, "--alpha"},
      {[](WorkerFlags* f) {
         f->outer = "diloco";
         f->outer_momentum = 1.0;
       },
       "momentum"},
      {[](WorkerFlags* f) {
         f->outer = "diloco";
         f->outer_lr = 0.0;
       },
       "--outer_lr=0"},
  };
  for (const auto& b : bad) {
    WorkerFlags g = f;  // easgd, async, 4 workers.
    b.set(&g);
    const auto refused = WorkerConfig::Parse(g);
    ASSERT_FALSE(refused.ok()) << b.words;
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(b.words), absl::string_view::npos)
        << refused.status();
  }
}

TEST(WorkerConfig, CudaDeviceNeedsACudaBuild) {
  WorkerFlags flags;
  flags.device = "cuda:3";
  const absl::StatusOr<WorkerConfig> config = WorkerConfig::Parse(flags);
  if (BuiltWithCuda()) {
    // Whether a GPU is there is the backend's call.
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->device.kind, DeviceChoice::kCuda);
    EXPECT_EQ(config->device.cuda_index, 3);
    EXPECT_EQ(config->device.Name(), "cuda:3");
  } else {
    EXPECT_EQ(config.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(config.status().message().find("without CUDA"),
              absl::string_view::npos)
        << config.status();
  }
}

}  // namespace
}  // namespace asyncps
