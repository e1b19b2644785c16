// ps_server: one shard of the asyncps parameter server.
//
//   ps_server --port=5000 --shard=0 --num_shards=2
//
// Serves the ParameterServer gRPC service (proto/asyncps.proto) until SIGTERM
// or SIGINT, then drains in-flight calls and exits 0. Once listening it
// prints one line to stdout, "ps_server shard I/N listening on HOST:PORT",
// which scripts and tests wait for (with --port=0 the port is the one the
// kernel chose).
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <memory>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mode.h"
#include "common/stop_signal.h"
#include "glog/logging.h"
#include "server/checkpoint.h"
#include "server/consistency.h"
#include "server/kv_store.h"
#include "server/membership.h"
#include "server/service.h"
#include "server/shard_store.h"

ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address to listen on (0.0.0.0 for every interface, 127.0.0.1 for "
          "this machine only).");
ABSL_FLAG(int, port, 5000, "TCP port to listen on; 0 picks a free one.");
ABSL_FLAG(int, shard, 0, "This server's shard index, in [0, num_shards).");
ABSL_FLAG(int, num_shards, 1, "Number of shards in the job.");
ABSL_FLAG(int64_t, max_message_bytes, 64 << 20,
          "Largest gRPC message accepted or sent, in bytes. Larger requests "
          "fail with RESOURCE_EXHAUSTED; clients split pulls and pushes to "
          "stay under it. Must be at least twice --slice_bytes of the model.");
ABSL_FLAG(int64_t, max_shard_bytes, int64_t{4} << 30,
          "Largest share of a model's weights this shard accepts, in bytes "
          "(optimizer state comes on top: up to 2x more for Adam). A larger "
          "DeclareModel fails with RESOURCE_EXHAUSTED.");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "Directory for this shard's checkpoints (shard-<i>-<time>.ckpt). At "
          "start the newest valid one is restored; one is written every "
          "--checkpoint_every, on the Checkpoint RPC, and at SIGTERM. Empty: "
          "no checkpoints.");
ABSL_FLAG(absl::Duration, checkpoint_every, absl::Seconds(60),
          "Period of checkpoints (0: only on request and at exit).");
ABSL_FLAG(int, checkpoint_keep, 3, "Checkpoint files kept per shard.");
ABSL_FLAG(absl::Duration, worker_timeout, absl::Seconds(10),
          "A worker not heard from for this long is no longer live.");
ABSL_FLAG(std::string, mode, "async",
          "async: apply every push on arrival; ssp: also hold a worker's pull "
          "until it is within --staleness clocks of the slowest live worker; "
          "bsp: apply the mean of each step's gradients once every live "
          "worker (less --backup_workers) has pushed; allreduce: workers "
          "all-reduce among themselves, the servers only keep their weights "
          "and the rendezvous store.");
ABSL_FLAG(int64_t, staleness, 2, "ssp: clocks a worker may run ahead.");
ABSL_FLAG(int, backup_workers, 0,
          "bsp: apply a step once live workers - this many have pushed; "
          "later gradients for it are dropped (counted in Stats).");
ABSL_FLAG(absl::Duration, step_deadline, absl::ZeroDuration(),
          "bsp: apply a step this long after its first gradient even if "
          "gradients are missing (0: no deadline).");
ABSL_FLAG(std::string, stale_policy, "none",
          "async/ssp: none, drop:K (drop gradients staler than K versions), "
          "or scale (learning rate / (1 + staleness)).");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "On SIGTERM, how long in-flight calls may take to finish.");

namespace asyncps {
namespace {

// Bytes reserved in each response for keys and framing.
constexpr int64_t kResponseOverhead = 64 << 10;

int Run() {
  const int shard = absl::GetFlag(FLAGS_shard);
  const int num_shards = absl::GetFlag(FLAGS_num_shards);
  const int port = absl::GetFlag(FLAGS_port);
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_bytes);
  if (num_shards < 1 || shard < 0 || shard >= num_shards) {
    LOG(ERROR) << "--shard=" << shard
               << " must be in [0, --num_shards=" << num_shards << ")";
    return 2;
  }
  if (port < 0 || port > 65535) {
    LOG(ERROR) << "--port=" << port << " is not a TCP port";
    return 2;
  }
  if (max_message < 2 * kResponseOverhead ||
      max_message > (int64_t{1} << 31) - 1) {
    LOG(ERROR) << "--max_message_bytes=" << max_message << " must be in ["
               << 2 * kResponseOverhead << ", 2^31 - 1]";
    return 2;
  }
  if (absl::GetFlag(FLAGS_worker_timeout) <= absl::ZeroDuration()) {
    LOG(ERROR) << "--worker_timeout must be positive";
    return 2;
  }
  ConsistencyConfig consistency_config;
  {
    auto mode = ParseMode(absl::GetFlag(FLAGS_mode));
    auto stale = ParseStalePolicy(absl::GetFlag(FLAGS_stale_policy));
    for (const absl::Status& s : {mode.status(), stale.status()}) {
      if (!s.ok()) {
        LOG(ERROR) << s.message();
        return 2;
      }
    }
    consistency_config.mode = *mode;
    consistency_config.stale = *stale;
    consistency_config.staleness = absl::GetFlag(FLAGS_staleness);
    consistency_config.backup_workers = absl::GetFlag(FLAGS_backup_workers);
    consistency_config.step_deadline = absl::GetFlag(FLAGS_step_deadline);
    if (consistency_config.staleness < 0 ||
        consistency_config.backup_workers < 0 ||
        consistency_config.step_deadline < absl::ZeroDuration()) {
      LOG(ERROR) << "--staleness, --backup_workers and --step_deadline must "
                    "not be negative";
      return 2;
    }
  }

  InstallStopSignalHandlers();

  if (absl::GetFlag(FLAGS_max_shard_bytes) < 1) {
    LOG(ERROR) << "--max_shard_bytes must be positive";
    return 2;
  }
  ShardStore store(shard, num_shards, max_message - kResponseOverhead,
                   static_cast<uint64_t>(absl::GetFlag(FLAGS_max_shard_bytes)));
  Membership membership(Clock::Real(), absl::GetFlag(FLAGS_worker_timeout));
  Consistency consistency(consistency_config, &store, &membership,
                          Clock::Real());
  KvStore kv;
  consistency.AddTickHook([&kv](absl::Time now) { kv.Expire(now); });
  std::unique_ptr<Checkpointer> checkpointer;
  const std::string checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (!checkpoint_dir.empty()) {
    if (absl::GetFlag(FLAGS_checkpoint_keep) < 1) {
      LOG(ERROR) << "--checkpoint_keep must be at least 1";
      return 2;
    }
    std::vector<std::string> skipped;
    auto newest = LoadNewestCheckpoint(checkpoint_dir, shard, &skipped);
    for (const std::string& why : skipped) {
      LOG(WARNING) << "skipping checkpoint: " << why;
    }
    if (newest.ok()) {
      absl::Status restored = store.Restore(*newest);
      if (!restored.ok()) {
        LOG(ERROR) << "cannot restore the newest checkpoint in "
                   << checkpoint_dir << ": " << restored;
        return 1;
      }
      LOG(INFO) << "restored model '" << newest->spec().name() << "' from "
                << checkpoint_dir << " (" << newest->slices_size()
                << " slices, taken at "
                << absl::FormatTime(absl::FromUnixMicros(newest->unix_micros()))
                << ")";
    } else if (newest.status().code() != absl::StatusCode::kNotFound) {
      LOG(ERROR) << newest.status();
      return 1;
    }
    checkpointer = std::make_unique<Checkpointer>(
        &store, checkpoint_dir, shard, absl::GetFlag(FLAGS_checkpoint_keep),
        absl::GetFlag(FLAGS_checkpoint_every), Clock::Real());
    Checkpointer* c = checkpointer.get();
    consistency.AddTickHook([c](absl::Time now) { c->MaybeWrite(now); });
  }
  ParameterServerService service(&store, &membership, &consistency, &kv,
                                 Clock::Real(), num_shards, checkpointer.get());

  const std::string address =
      absl::StrCat(absl::GetFlag(FLAGS_host), ":", port);
  int bound_port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(),
                           &bound_port);
  builder.SetMaxReceiveMessageSize(static_cast<int>(max_message));
  builder.SetMaxSendMessageSize(static_cast<int>(max_message));
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || bound_port == 0) {
    LOG(ERROR) << "could not listen on " << address;
    return 1;
  }
  LOG(INFO) << "ps_server shard " << shard << "/" << num_shards
            << " serving asyncps.v1.ParameterServer on "
            << absl::GetFlag(FLAGS_host) << ":" << bound_port << " (mode "
            << ModeName(consistency_config.mode) << ", max message "
            << max_message << " bytes)";
  std::printf("ps_server shard %d/%d listening on %s:%d\n", shard, num_shards,
              absl::GetFlag(FLAGS_host).c_str(), bound_port);
  std::fflush(stdout);

  const int sig = WaitForStopSignal();
  LOG(INFO) << "signal " << sig << ": shutting down shard " << shard;
  // Held calls would otherwise wait out the grace period.
  consistency.Shutdown();
  kv.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() +
                   absl::ToChronoSeconds(absl::GetFlag(FLAGS_shutdown_grace)));
  server->Wait();
  if (checkpointer != nullptr && store.declared()) {
    auto path = checkpointer->Write();
    if (path.ok()) {
      LOG(INFO) << "final checkpoint " << *path;
    } else {
      LOG(ERROR) << "final checkpoint failed: " << path.status();
    }
  }
  ShardCounters c = store.Counters();
  LOG(INFO) << "shard " << shard << " stopped after " << c.pushes << " pushes, "
            << c.pulls << " pulls, " << c.rejected << " rejected";
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "One shard of the asyncps parameter server.\n"
      "  ps_server --port=5000 --shard=0 --num_shards=2");
  absl::ParseCommandLine(argc, argv);
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  return asyncps::Run();
}
