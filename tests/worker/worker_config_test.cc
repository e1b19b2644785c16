// WorkerConfig::Validate in-process: every bad flag is refused with a
// message naming it, before the worker touches a device, a file or the
// network.
#include "worker/worker_config.h"

#include <functional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/device.h"

namespace asyncps {
namespace {

TEST(WorkerConfig, DefaultsAreValid) {
  WorkerConfig config;
  EXPECT_TRUE(config.Validate().ok()) << config.Validate();
  EXPECT_EQ(config.ParsedMode(), Mode::kAsync);
  EXPECT_EQ(config.Layers(), (std::vector<int>{784, 256, 128, 10}));
  EXPECT_EQ(config.Optimizer().kind(), v1::OptimizerSpec::MOMENTUM);
  EXPECT_EQ(config.CollectiveKind(-1), "gloo");
  EXPECT_EQ(config.CollectiveKind(0), "nccl");
  EXPECT_EQ(config.WireDtype(), v1::DTYPE_F32);
  EXPECT_EQ(config.Exchange(), PsExchange::Mode::kFused);
}

TEST(WorkerConfig, OnlyAsyncFusesItsExchange) {
  WorkerConfig config;
  config.exchange = "prefetch";
  EXPECT_EQ(config.Exchange(), PsExchange::Mode::kPrefetch);
  for (const char* mode : {"ssp", "bsp"}) {
    config.mode = mode;
    ASSERT_TRUE(config.Validate().ok());
    EXPECT_EQ(config.Exchange(), PsExchange::Mode::kLayered) << mode;
  }
}

TEST(WorkerConfig, BadFlagsAreRefusedNamingThem) {
  struct Case {
    std::function<void(WorkerConfig*)> set;
    std::string words;
  };
  const std::vector<Case> cases = {
      {[](WorkerConfig* c) { c->role = "trainer"; }, "--role=trainer"},
      {[](WorkerConfig* c) { c->mode = "eventual"; }, "eventual"},
      {[](WorkerConfig* c) { c->device = "tpu:0"; }, "--device=tpu:0"},
      {[](WorkerConfig* c) { c->device = "cuda:x"; }, "--device=cuda:x"},
      {[](WorkerConfig* c) { c->precision = "fp8"; }, "--precision=fp8"},
      {[](WorkerConfig* c) { c->layers = "784,x,10"; }, "--layers"},
      {[](WorkerConfig* c) { c->optimizer = "lion"; }, "--optimizer=lion"},
      {[](WorkerConfig* c) { c->lr = -1; }, "learning_rate"},
      {[](WorkerConfig* c) { c->servers = "nohostport"; }, "--servers"},
      {[](WorkerConfig* c) { c->rank = 2, c->num_workers = 2; }, "--rank=2"},
      {[](WorkerConfig* c) { c->num_workers = 0; }, "--num_workers=0"},
      {[](WorkerConfig* c) { c->slowdown = 0.5; }, "--slowdown"},
      {[](WorkerConfig* c) { c->until_done = true; }, "--until_done"},
      {[](WorkerConfig* c) {
         c->role = "evaluator", c->until_done = c->eval_once = true;
       },
       "--until_done"},
      {[](WorkerConfig* c) { c->batch_size = 0; }, "--batch_size"},
      {[](WorkerConfig* c) { c->batch_size = 1 << 20; }, "--batch_size"},
      {[](WorkerConfig* c) { c->accumulate = 0; }, "--accumulate"},
      {[](WorkerConfig* c) { c->epochs = 0; }, "--epochs"},
      {[](WorkerConfig* c) { c->collective = "mpi"; }, "--collective=mpi"},
      {[](WorkerConfig* c) { c->blas_threads = 0; }, "--blas_threads"},
      {[](WorkerConfig* c) { c->wire_dtype = "fp8"; }, "--wire_dtype=fp8"},
      {[](WorkerConfig* c) { c->exchange = "gossip"; }, "--exchange=gossip"},
      {[](WorkerConfig* c) { c->compress = "topk:2"; }, "--compress=topk:2"},
      {[](WorkerConfig* c) {
         c->mode = "allreduce", c->compress = "topk:0.01";
       },
       "f16 only"},
      {[](WorkerConfig* c) {
         c->mode = "allreduce", c->compress = "f16", c->collective = "nccl";
       },
       "--collective=nccl"},
      {[](WorkerConfig* c) { c->rpc_timeout = absl::ZeroDuration(); },
       "--rpc_timeout"},
      {[](WorkerConfig* c) { c->heartbeat_every = absl::Seconds(-1); },
       "--heartbeat_every"},
  };
  for (const Case& c : cases) {
    WorkerConfig config;
    c.set(&config);
    absl::Status s = config.Validate();
    EXPECT_FALSE(s.ok()) << c.words;
    EXPECT_NE(s.message().find(c.words), absl::string_view::npos)
        << c.words << ": " << s;
  }
}

TEST(WorkerConfig, CudaDeviceNeedsACudaBuild) {
  WorkerConfig config;
  config.device = "cuda:0";
  absl::Status s = config.Validate();
  if (BuiltWithCuda()) {
    EXPECT_TRUE(s.ok()) << s;  // Whether a GPU is there is the backend's call.
  } else {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find("without CUDA"), absl::string_view::npos) << s;
  }
}

}  // namespace
}  // namespace asyncps
