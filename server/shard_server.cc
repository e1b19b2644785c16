#include "server/shard_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include <chrono>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/random_id.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "rpc/grpc_credentials.h"
#include "server/checkpoint_format.h"
#include "server/checkpoint_restore.h"
#include "transport/tls.h"

namespace asyncps {

namespace {

// A fresh, nonzero id for this start of the shard.
Membership::Resume ResumeFor(Mode mode) {
  return mode == Mode::kAsync || mode == Mode::kSsp
             ? Membership::Resume::kOwnClock
             : Membership::Resume::kJobFront;
}

// The consistency rules' configuration, told about held pulls by `observer`.
ConsistencyConfig Observed(ConsistencyConfig config, CallObserver* observer) {
  config.observer = observer;
  return config;
}

}  // namespace

// Who hears of each call: the metrics and the timeline, those there are.
CallObservers Observers(CallObserver* metrics, CallObserver* timeline) {
  CallObservers all;
  all.Add(metrics);
  all.Add(timeline);
  return all;
}

ShardServer::ShardServer(const ShardServerConfig& config, Env env,
                         std::unique_ptr<Timeline> timeline)
    : config_(config),
      env_(env),
      timeline_(std::move(timeline)),
      call_timeline_(timeline_ != nullptr
                         ? std::make_unique<CallTimeline>(timeline_.get())
                         : nullptr),
      rpc_metrics_(!config.host.empty() && config.metrics_port > 0
                       ? std::make_unique<RpcMetrics>()
                       : nullptr),
      observers_(Observers(rpc_metrics_.get(), call_timeline_.get())),
      store_(config.shard, config.num_shards,
             config.max_message_bytes - kResponseOverhead,
             static_cast<uint64_t>(config.max_shard_bytes),
             config.incarnation != 0 ? config.incarnation : RandomId()),
      membership_(env.clock, config.worker_timeout,
                  ResumeFor(config.consistency.mode), config.num_workers,
                  config.rejoin_grace, config.elastic),
      consistency_(Observed(config.consistency, observer()), &store_,
                   &membership_, env.clock, &tables_, config.num_shards),
      kv_(env.clock) {
  if (config.replicated) {
    PushPolicy base;
    base.mode = config.consistency.mode;
    base.stale = config.consistency.stale;
    replication_ = std::make_unique<Replication>(&store_, consistency_.ledger(),
                                                 env.clock, config.member, base,
                                                 config.replica_ack_timeout);
    replication_->set_min_insync(config.min_insync);
    replication_->set_join_backlog_bytes(
        static_cast<size_t>(config.join_backlog_bytes));
    replication_->set_member_token(config.security.member_token);
    replication_->set_tables(&tables_, config.num_shards);
    replication_->set_membership(&membership_);
    consistency_.set_replication(replication_.get());
  }
}

absl::StatusOr<std::unique_ptr<ShardServer>> ShardServer::Start(
    const ShardServerConfig& config, Env env) {
  RETURN_IF_ERROR(config.Validate());
  std::unique_ptr<Timeline> timeline;
  if (!config.timeline.empty()) {
    ASSIGN_OR_RETURN(
        timeline,
        Timeline::Open(config.timeline, absl::StrCat("shard ", config.shard)));
  }
  std::unique_ptr<ShardServer> server(
      new ShardServer(config, env, std::move(timeline)));
  if (server->replication_ != nullptr && !config.security.ca_pem.empty() &&
      !config.security.cert_pem.empty()) {
    // Mutual TLS: a joiner presents the members' (the shards') certificate.
    ASSIGN_OR_RETURN(std::string name,
                     CertificateName(config.security.cert_pem));
    server->replication_->set_member_name(std::move(name));
  }
  RETURN_IF_ERROR(server->Restore());
  RETURN_IF_ERROR(server->Listen());
  if (server->replication_ != nullptr) {
    server->replication_->set_member(
        !config.member.empty() ? config.member
                               : DefaultMember(config.host, server->port_));
  }
  server->ticker_ = std::thread([s = server.get()] { s->Housekeeping(); });
  if (server->checkpointer_ != nullptr) {
    server->checkpoints_ =
        std::thread([s = server.get()] { s->PeriodicCheckpoints(); });
  }
  return server;
}

void ShardServer::BecomingPrimary() {
  membership_.Restarted();
  NoteJobFront();
}

void ShardServer::NoteJobFront() {
  // bsp: the steps its slices applied; async and ssp resume a rank at its
  // own clock, allreduce keeps no steps here.
  if (config_.consistency.mode == Mode::kBsp) {
    membership_.NoteJobFront(store_.Progress(/*bsp=*/true).second);
  }
}

absl::Status ShardServer::Restore() {
  if (config_.checkpoint_dir.empty()) return absl::OkStatus();
  if (config_.replicated) {
    // A member's state comes from its group; checkpoints are still written.
    NewCheckpointer();
    return absl::OkStatus();
  }
  // Found unusable now rather than at the first checkpoint, minutes in.
  const std::string probe =
      absl::StrCat(config_.checkpoint_dir, "/.probe-shard-", config_.shard);
  auto file = env_.fs->NewWritableFile(probe);
  absl::Status writable = file.status();
  if (file.ok()) {
    writable = (*file)->Close();
    env_.fs->Delete(probe).IgnoreError();
  }
  if (!writable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_dir=", config_.checkpoint_dir,
        " is not a directory this shard can write to: ", writable.message()));
  }
  // Each file streams into the store and tables, a slice at a time; they
  // change only once a file checked out whole.
  std::vector<std::string> paths;
  if (config_.restore_job.empty()) {
    paths = CheckpointFiles(env_.fs, config_.checkpoint_dir, config_.shard);
  } else {
    // A whole job restored to one consistent point: that file or nothing.
    paths.push_back(JobCheckpointPath(config_.checkpoint_dir,
                                      config_.restore_job, config_.shard));
  }
  for (const std::string& path : paths) {
    RestoreSink sink(&store_, &tables_);
    RestoreProgress progress(
        path, env_.fs->FileSize(path).value_or(0), env_.clock,
        [](const std::string& line) { LOG(INFO) << line; });
    absl::Status s = ReadChunkedFile(env_.fs, path, &sink, std::ref(progress));
    if (s.ok()) {
      LOG(INFO) << "restored model '" << sink.head().spec().name() << "' from "
                << path << " (" << progress.Done() << "; " << sink.slices()
                << " slices, " << sink.tables()
                << " embedding tables, taken at "
                << absl::FormatTime(
                       absl::FromUnixMicros(sink.head().unix_micros()))
                << ")";
      NoteJobFront();
      break;
    }
    if (!config_.restore_job.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--restore_job=", config_.restore_job, ": ", s.message()));
    }
    // A file the model refuses (another model's) stops the start, as a
    // damaged one does not: an older one would hide the mistake.
    if (sink.refused()) {
      return Annotate(s,
                      absl::StrCat("cannot restore the newest checkpoint in ",
                                   config_.checkpoint_dir));
    }
    LOG(WARNING) << "skipping checkpoint: " << s;
  }
  NewCheckpointer();
  return absl::OkStatus();
}

void ShardServer::NewCheckpointer() {
  checkpointer_ = std::make_unique<Checkpointer>(
      &store_, env_.fs, config_.checkpoint_dir, config_.shard,
      config_.checkpoint_keep, config_.checkpoint_every, env_.clock);
  checkpointer_->set_timeline(timeline_.get());
  checkpointer_->set_embeddings(&tables_);
}

int ShardServer::data_port() const {
  return data_plane_ == nullptr ? 0 : data_plane_->port();
}

std::string ShardServer::data_token() const {
  return data_plane_ == nullptr ? "" : data_plane_->token();
}

namespace {

// 128 random bits, hex: what a data-plane connection must present.
std::string NewToken() {
  std::random_device random;
  std::string token;
  for (int i = 0; i < 4; ++i) {
    absl::StrAppend(&token, absl::Hex(random(), absl::kZeroPad8));
  }
  return token;
}

}  // namespace

absl::Status ShardServer::Listen() {
  v1::DataPlaneResponse data_plane;
  if (!config_.host.empty() && config_.data_port >= 0) {
    DataPlaneConfig dc;
    dc.host = config_.host;
    dc.port = config_.data_port;
    dc.max_frame_bytes = static_cast<uint64_t>(config_.max_message_bytes);
    dc.max_connections = config_.max_data_connections;
    dc.max_connections_per_peer = config_.max_data_connections_per_client;
    dc.observer = observer();
    dc.replication = replication_.get();
    if (config_.security.tls()) {
      // The gRPC port's certificate, key and CA, so the same clients get in.
      auto tls = TlsContext::ForServer(config_.security);
      if (!tls.ok()) return Annotate(tls.status(), "data plane TLS");
      dc.tls = *std::move(tls);
    }
    auto started = DataPlaneServer::Start(dc, NewToken(), &store_, &membership_,
                                          &consistency_, env_.clock);
    if (!started.ok()) return Annotate(started.status(), "data plane");
    data_plane_ = *std::move(started);
    data_plane.set_port(static_cast<uint32_t>(data_plane_->port()));
    data_plane.set_token(data_plane_->token());
  }
  service_ = std::make_unique<ParameterServerService>(
      &store_, &membership_, &consistency_, &kv_, env_.clock,
      config_.num_shards, checkpointer_.get(), &tables_, std::move(data_plane),
      config_.security.token, config_.security.admin_token);
  // The standard grpc.health.v1 service (SERVING once this returns: the
  // checkpoint is restored) and server reflection, for gRPC's own tools.
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  const std::string address = absl::StrCat(config_.host, ":", config_.port);
  if (!config_.host.empty()) {
    builder.AddListeningPort(address, MakeServerCredentials(config_.security),
                             &port_);
  }
  builder.SetMaxReceiveMessageSize(static_cast<int>(config_.max_message_bytes));
  builder.SetMaxSendMessageSize(static_cast<int>(config_.max_message_bytes));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             config_.max_streams_per_connection);
  builder.RegisterService(service_.get());
  if (observer() != nullptr) {
    std::vector<
        std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
        interceptors;
    interceptors.push_back(CallInterceptorFactory(observer()));
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || (!config_.host.empty() && port_ == 0)) {
    return absl::UnavailableError(
        absl::StrCat("could not listen on ", address));
  }
  if (rpc_metrics_ != nullptr) {
    metrics_ = std::make_shared<ShardMetrics>(service_->Parts());
    ASSIGN_OR_RETURN(metrics_endpoint_,
                     MetricsEndpoint::Start(config_.host, config_.metrics_port,
                                            "--metrics_port"));
    metrics_endpoint_->Register(metrics_);
    metrics_endpoint_->Register(rpc_metrics_->registry());
  }
  LOG(INFO) << "ps_server shard " << config_.shard << "/" << config_.num_shards
            << " serving asyncps.v1.ParameterServer on " << config_.host << ":"
            << port_ << ", data plane on port " << data_port() << " (mode "
            << ModeName(config_.consistency.mode) << ", max message "
            << config_.max_message_bytes << " bytes)";
  return absl::OkStatus();
}

std::shared_ptr<grpc::Channel> ShardServer::InProcessChannel() {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(config_.max_message_bytes));
  args.SetMaxSendMessageSize(-1);  // The server's limit is the one tested.
  return server_->InProcessChannel(args);
}

void ShardServer::Housekeeping() {
  // The server's own period, not a way of waiting for another process.
  while (!stop_.WaitForNotificationWithTimeout(config_.tick)) {
    consistency_.Tick();
    kv_.Expire();
  }
}

void ShardServer::PeriodicCheckpoints() {
  // Apart from Housekeeping, so a slow disk never delays held pulls, bsp
  // deadlines or liveness.
  while (!stop_.WaitForNotificationWithTimeout(config_.tick)) {
    // Not while the weights are awaited (Drain says why).
    if (consistency_.AwaitingRestore()) continue;
    checkpointer_->MaybeWrite(env_.clock->Now());
  }
}

void ShardServer::Drain() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (drained_) return;
    drained_ = true;
  }
  if (server_ != nullptr) {
    server_->GetHealthCheckService()->SetServingStatus(false);
  }
  // A model whose weights are still awaited (declared with its initial
  // weights to follow, or restored from a worker's copy) holds only the
  // initializer's placeholder: no checkpoint may pass it off as trained.
  const bool weights_held = !consistency_.AwaitingRestore();
  // No update after this: the last checkpoint holds everything applied.
  consistency_.Pause(/*until_step=*/0, absl::InfiniteDuration());
  // Held calls would otherwise wait out the grace period.
  consistency_.Shutdown();
  // Before the data plane: its backups' connections wait on the stream.
  if (replication_ != nullptr) replication_->Fence("the server is stopping");
  kv_.Shutdown();
  if (data_plane_ != nullptr) data_plane_->Shutdown();
  if (!weights_held) {
    LOG(WARNING) << "shard " << config_.shard << ": no final checkpoint: "
                 << "the model's weights had not come yet";
  } else if (ticker_.joinable() && checkpointer_ != nullptr &&
             checkpointer_->HasState()) {
    auto path = checkpointer_->Write();
    if (path.ok()) {
      LOG(INFO) << "final checkpoint " << *path;
    } else {
      LOG(ERROR) << "final checkpoint failed: " << path.status();
    }
  }
}

void ShardServer::Shutdown() {
  {
    absl::MutexLock lock(&shutdown_mu_);
    if (shut_down_) return;
    shut_down_ = true;
  }
  Drain();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() +
                      absl::ToChronoMilliseconds(config_.shutdown_grace));
    server_->Wait();
  }
  stop_.Notify();
  if (ticker_.joinable()) ticker_.join();
  if (checkpoints_.joinable()) checkpoints_.join();
  ShardCounters c = store_.Counters();
  LOG(INFO) << "shard " << config_.shard << " stopped after "
            << c[ShardCounter::kPushes] << " pushes, "
            << c[ShardCounter::kPulls] << " pulls, "
            << c[ShardCounter::kRejected] << " rejected";
}

}  // namespace asyncps
