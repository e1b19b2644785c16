// ps_server: one shard of the asyncps parameter server, e.g.
//   ps_server --port=5000 --shard=0 --num_shards=2
// Serves the ParameterServer gRPC service (proto/asyncps.proto) until SIGTERM
// or SIGINT, then drains in-flight calls and exits 0. Once listening it
// writes --ready_file (JSON, if given: launchers wait for it), then prints
// one line to stdout, "ps_server shard I/N listening on HOST:PORT" (with
// --port=0 the port is the one the kernel chose).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "common/file_system.h"
#include "common/large_buffers.h"
#include "common/mode.h"
#include "common/program_flags.h"
#include "common/security_flags.h"
#include "common/status.h"
#include "common/stop_signal.h"
#include "glog/logging.h"
#include "server/replica/etcd_coordinator.h"
#include "server/replica/etcd_flags.h"
#include "server/replica/replica_member.h"
#include "server/shard_server.h"

ABSL_FLAG(std::string, host, "0.0.0.0",
          "Address to listen on (0.0.0.0 for every interface, 127.0.0.1 for "
          "this machine only).");
ABSL_FLAG(int, port, 5000, "TCP port to listen on; 0 picks a free one.");
ABSL_FLAG(int, data_port, 0,
          "TCP port of the data plane, where workers' pulls and pushes travel "
          "as framed TCP beside gRPC (the fast path; workers find the port "
          "through gRPC): 0 picks a free one; -1 serves none (workers then "
          "need --transport=grpc).");
ABSL_FLAG(int, max_data_connections, 1024,
          "Data-plane connections served at once; more are refused with "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, max_data_connections_per_client, 256,
          "Of those, how many one client address may hold.");
ABSL_FLAG(int, max_streams_per_connection, 256,
          "Calls one gRPC connection may have in flight at once (HTTP/2 "
          "SETTINGS_MAX_CONCURRENT_STREAMS); a client's further calls wait.");
ABSL_FLAG(int, num_workers, 0,
          "The job's worker count: another --num_workers (or a rank outside "
          "it) is refused. 0: the first worker's (the next's once none live).");
ABSL_FLAG(bool, elastic, false,
          "Workers join and leave while the job trains (docs/ELASTIC.md).");
ABSL_FLAG(absl::Duration, rejoin_grace, absl::ZeroDuration(),
          "After the shard starts, how long workers that have not registered "
          "with it (it restarted; their heartbeats register them within a "
          "second) may pull and push as their ranks. 0 (the default): never; "
          "a rank must register first (UNAVAILABLE until it has, which the "
          "workers retry).");
ABSL_FLAG(int, metrics_port, 0,
          "TCP port of Prometheus' /metrics (the shard's counters, workers "
          "and staleness, read at scrape time); 0: none.");
ABSL_FLAG(std::string, timeline, "",
          "Write a Chrome trace-event timeline of the calls served, held "
          "pulls and checkpoints to this file (merge a run's files with "
          "psctl timeline); empty: none.");
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
ABSL_FLAG(std::string, restore_job, "",
          "Restore job checkpoint <tag> (written by psctl checkpoint "
          "--tag=<tag> to every shard at the same model version) instead of "
          "the newest periodic one: start every shard of the job with it.");
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
ABSL_FLAG(absl::Duration, heal_after, absl::Seconds(15),
          "bsp: a step still short of gradients this long after its first, "
          "with every missing live rank blocked waiting for it, is applied "
          "without them (logged, counted as short); 0: never. Keep it below "
          "the workers' --retry_for.");
ABSL_FLAG(std::string, stale_policy, "none",
          "async/ssp: none, drop:K, scale (lr / (1 + staleness)), "
          "dc:LAMBDA[:WINDOW] (DC-ASGD) or dca: (adaptive): docs/MODES.md.");
ABSL_FLAG(absl::Duration, stall_warn, absl::Seconds(10),
          "ssp/bsp: a pull held longer than this is logged once, naming the "
          "ranks it waits for and when each was last seen (also in psctl "
          "status); 0: never.");
ABSL_FLAG(absl::Duration, restore_wait, absl::Seconds(10),
          "A shard restarted without a checkpoint gets the model declared "
          "again by the workers; it waits this long for a worker's copy of "
          "the weights before serving the initial ones.");
ABSL_FLAG(std::string, ready_file, "",
          "Once serving, write this JSON file (atomically): shard, "
          "num_shards, host, port, data_port, pid. Launchers wait for it "
          "instead of reading the log; empty: none.");
ABSL_FLAG(absl::Duration, shutdown_grace, absl::Seconds(5),
          "On SIGTERM, how long in-flight calls may take to finish. The "
          "whole drain (with the last checkpoint) gets this plus 60 s, then "
          "the process exits 1; a second SIGTERM or SIGINT exits at once.");

ABSL_FLAG(int, replicas, 0,
          "Run this shard as a replicated group of this many processes (2 or "
          "3; docs/DESIGN.md \"Replicated shards\"), each with the same "
          "--shard, --job and --etcd: the primary streams every change to "
          "the backups before it answers. 0: one process, no etcd.");
ABSL_FLAG(std::string, etcd, "",
          "--replicas: etcd's client address (host:port) for the election "
          "and the shard map.");
ABSL_FLAG(std::string, job, "default",
          "--replicas: the job's name; its keys in etcd are under "
          "/asyncps/<job>/ (a new job, a new name: the keys outlive it).");
ABSL_FLAG(std::string, advertise, "",
          "--replicas: this member's address (host:port) as the other "
          "members and the workers reach it; default --host:--port "
          "(127.0.0.1 for a wildcard --host).");
ABSL_FLAG(absl::Duration, lease_ttl, absl::Seconds(1),
          "--replicas: the etcd lease a primary holds; it is deposed this "
          "long after it stops renewing (etcd rounds up to whole seconds and "
          "grants no less than 1.5 of its election timeouts).");
ABSL_FLAG(bool, bootstrap, false,
          "--replicas: create the group's records in etcd if it has none; "
          "one member of a new group, first start only (or `psctl group "
          "init`): no member leads a group without records, lest one with no "
          "state be elected over one holding the shard after etcd lost them.");
ABSL_FLAG(int, min_insync, 0,
          "--replicas: the fewest members, primary included, holding a "
          "change before it is acknowledged (Kafka's min.insync.replicas); "
          "below it changes are refused UNAVAILABLE, reads go on. 0: 2 in a "
          "group of 2 or more; 1: the primary alone may acknowledge.");
ABSL_FLAG(int64_t, join_backlog_bytes, int64_t{2} << 30,
          "--replicas: how many bytes of changes a joining backup may fall "
          "behind while its snapshot goes out (memory on both sides); past "
          "it the backup joins again.");
ABSL_FLAG(absl::Duration, replica_ack_timeout, absl::Seconds(5),
          "--replicas: how long a backup may take to acknowledge a change "
          "before the primary drops it (it rejoins by itself).");

ABSL_FLAG(bool, exit_when_done, false,
          "Once every worker of the job (--num_workers, or the count the "
          "workers registered with) has finished, serve reads for "
          "--done_linger (the evaluator's final score, psctl export), then "
          "drain (the last checkpoint) and exit 0, as a batch job's task "
          "does. A SIGTERM during the linger drains at once. With --replicas "
          "every member ends: the primary that sees the job done says so in "
          "etcd (/asyncps/<job>/done: give each job its own --job).");
ABSL_FLAG(absl::Duration, done_linger, absl::Seconds(30),
          "--exit_when_done: how long the finished job's model stays "
          "readable before the shard exits.");

namespace asyncps {
namespace {

// Waits for SIGTERM or SIGINT, or with --exit_when_done for the job to be
// done and the linger to pass; returns the signal, or 0 for the job's end.
int WaitForStopOrDone(const ShardServer& server, int shard) {
  if (!absl::GetFlag(FLAGS_exit_when_done)) return WaitForStopSignal();
  int sig;  // Noticing the job's end a second late is nothing to a linger.
  while ((sig = WaitForStopSignal(absl::Seconds(1))) < 0) {
    if (server.JobDone()) break;
  }
  if (sig >= 0) return sig;
  const absl::Duration linger = absl::GetFlag(FLAGS_done_linger);
  LOG(INFO) << "shard " << shard << ": every worker of the job finished; "
            << "serving reads for " << linger << " (--done_linger), then "
            << "exiting";
  sig = WaitForStopSignal(linger);
  return sig < 0 ? 0 : sig;
}

// What the drain may take beyond --shutdown_grace (the last checkpoint).
constexpr absl::Duration kDrainBudget = absl::Seconds(60);

absl::StatusOr<ShardServerConfig> ConfigFromFlags() {
  ShardServerConfig config;
  config.host = absl::GetFlag(FLAGS_host);
  config.port = absl::GetFlag(FLAGS_port);
  config.data_port = absl::GetFlag(FLAGS_data_port);
  config.max_data_connections = absl::GetFlag(FLAGS_max_data_connections);
  config.max_data_connections_per_client =
      absl::GetFlag(FLAGS_max_data_connections_per_client);
  config.max_streams_per_connection =
      absl::GetFlag(FLAGS_max_streams_per_connection);
  config.num_workers = absl::GetFlag(FLAGS_num_workers);
  config.elastic = absl::GetFlag(FLAGS_elastic);
  config.rejoin_grace = absl::GetFlag(FLAGS_rejoin_grace);
  config.metrics_port = absl::GetFlag(FLAGS_metrics_port);
  config.timeline = absl::GetFlag(FLAGS_timeline);
  config.shard = absl::GetFlag(FLAGS_shard);
  config.num_shards = absl::GetFlag(FLAGS_num_shards);
  config.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  config.max_shard_bytes = absl::GetFlag(FLAGS_max_shard_bytes);
  config.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  config.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  config.restore_job = absl::GetFlag(FLAGS_restore_job);
  config.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  config.worker_timeout = absl::GetFlag(FLAGS_worker_timeout);
  config.shutdown_grace = absl::GetFlag(FLAGS_shutdown_grace);
  ASSIGN_OR_RETURN(config.consistency.mode,
                   ParseMode(absl::GetFlag(FLAGS_mode)));
  ASSIGN_OR_RETURN(config.consistency.stale,
                   ParseStalePolicy(absl::GetFlag(FLAGS_stale_policy)));
  config.consistency.staleness = absl::GetFlag(FLAGS_staleness);
  config.consistency.backup_workers = absl::GetFlag(FLAGS_backup_workers);
  config.consistency.step_deadline = absl::GetFlag(FLAGS_step_deadline);
  config.consistency.restore_wait = absl::GetFlag(FLAGS_restore_wait);
  config.consistency.stall_warn = absl::GetFlag(FLAGS_stall_warn);
  config.consistency.heal_after = absl::GetFlag(FLAGS_heal_after);
  ASSIGN_OR_RETURN(config.security,
                   LoadSecurity(SecurityFlagsFromCommandLine()));
  if (config.security.tls() && config.security.cert_pem.empty()) {
    return absl::InvalidArgumentError(
        "--tls_ca without --tls_cert: a server needs its own certificate and "
        "key for TLS");
  }
  const int replicas = absl::GetFlag(FLAGS_replicas);
  if (replicas != 0) {
    if (replicas < 1 || replicas > 5) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--replicas=", replicas, ": a group has 2 or 3 members (1-5)"));
    }
    if (absl::GetFlag(FLAGS_etcd).empty()) {
      return absl::InvalidArgumentError(
          "--replicas needs --etcd (host:port of etcd's client URL)");
    }
    if (config.port == 0) {
      return absl::InvalidArgumentError(
          "--replicas needs a fixed --port: the group and the workers list "
          "the member's address");
    }
    config.replicated = true;
    config.member = absl::GetFlag(FLAGS_advertise);
    if (config.member.empty()) {
      config.member = DefaultMember(config.host, config.port);
    }
    config.replica_ack_timeout = absl::GetFlag(FLAGS_replica_ack_timeout);
    config.join_backlog_bytes = absl::GetFlag(FLAGS_join_backlog_bytes);
    const int min_insync = absl::GetFlag(FLAGS_min_insync);
    const int by_default = std::min(replicas, 2);
    if (min_insync < 0 || min_insync > replicas) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--min_insync=", min_insync, " must be in [1, --replicas=", replicas,
          "] (0: the default, ", by_default, ")"));
    }
    config.min_insync = min_insync != 0 ? min_insync : by_default;
  } else if (absl::GetFlag(FLAGS_min_insync) != 0) {
    return absl::InvalidArgumentError(
        "--min_insync needs --replicas: an unreplicated shard is one member");
  }
  RETURN_IF_ERROR(config.Validate());
  return config;
}

// Writes --ready_file, if given: the server's identity and ports.
absl::Status WriteReadyFile(const ShardServerConfig& config,
                            const ShardServer& server) {
  const std::string ready = absl::GetFlag(FLAGS_ready_file);
  if (ready.empty()) return absl::OkStatus();
  return WriteFileAtomically(
      FileSystem::Default(), ready,
      absl::StrFormat("{\"shard\": %d, \"num_shards\": %d, \"host\": "
                      "\"%s\", \"port\": %d, \"data_port\": %d, "
                      "\"pid\": %d}\n",
                      config.shard, config.num_shards,
                      absl::CEscape(config.host), server.port(),
                      server.data_port(), static_cast<int>(getpid())));
}

// --replicas --exit_when_done: whether the job is done, as the primary of
// any group saw it (its workers finished) and wrote under `done_key`.
bool GroupJobDone(ReplicaMember& member, Coordinator* coordinator,
                  const std::string& done_key) {
  if (member.role() == Replication::Role::kPrimary &&
      member.server()->JobDone()) {
    // Fenced: a primary deposed meanwhile records nothing.
    return member.RecordJobDone(done_key).ok();
  }
  return coordinator->Get(done_key).ok();
}

// --replicas: one member of the shard's group, started again each time it
// ends by itself (empty, or with the state it held as a primary whose lease
// ran out); on a signal it steps down (its lease revoked) and drains.
int RunReplicated(const ShardServerConfig& config, const EtcdTls& etcd_tls) {
  ReplicaConfig rc;
  rc.prefix = absl::StrCat("/asyncps/", absl::GetFlag(FLAGS_job));
  rc.lease_ttl = absl::GetFlag(FLAGS_lease_ttl);
  // Only this process's first member: one started again after its group
  // lost its records (etcd lost its keys) must not create an empty group.
  rc.bootstrap = absl::GetFlag(FLAGS_bootstrap);
  // --exit_when_done: the primary, which the workers register with, says
  // so here for every member of the job.
  const std::string done_key = absl::StrCat(rc.prefix, "/done");
  bool ready = false;
  while (true) {
    // A new channel for each member (it outlives the member): one that
    // failed to connect (etcd not up yet) would back off for seconds.
    EtcdCoordinator etcd(absl::GetFlag(FLAGS_etcd), absl::Seconds(2), etcd_tls);
    auto member = ReplicaMember::Start(config, rc, &etcd);
    if (!member.ok()) {
      if (member.status().code() == absl::StatusCode::kInvalidArgument) {
        LOG(ERROR) << member.status();
        return 2;
      }
      // etcd not up yet, or the port not free again yet: a while later.
      LOG(WARNING) << "shard " << config.shard << ": cannot start a member ("
                   << member.status() << "); again in 1 s";
      if (WaitForStopSignal(absl::Seconds(1)) >= 0) return 0;
      continue;
    }
    rc.bootstrap = false;
    rc.held = nullptr;  // Taken back (or not) by this member.
    if (!ready) {
      if (absl::Status s = WriteReadyFile(config, *(*member)->server());
          !s.ok()) {
        LOG(ERROR) << "--ready_file: " << s;
        return 1;
      }
      std::printf("ps_server shard %d/%d member %s listening on %s:%d\n",
                  config.shard, config.num_shards, config.member.c_str(),
                  config.host.c_str(), (*member)->server()->port());
      std::fflush(stdout);
      ready = true;
    }
    int sig;
    absl::Time next_look = absl::InfinitePast();
    while ((sig = WaitForStopSignal(absl::Milliseconds(100))) < 0) {
      if ((*member)->Ended(absl::ZeroDuration())) break;
      if (absl::GetFlag(FLAGS_exit_when_done) && absl::Now() >= next_look) {
        next_look = absl::Now() + absl::Seconds(1);
        if (GroupJobDone(**member, &etcd, done_key)) {
          const absl::Duration linger = absl::GetFlag(FLAGS_done_linger);
          LOG(INFO) << "shard " << config.shard << ": every worker of the "
                    << "job finished; member " << config.member
                    << " serves reads for " << linger
                    << " (--done_linger), then exits";
          sig = WaitForStopSignal(linger);
          (*member)->Stop();
          return 0;
        }
      }
    }
    if (sig >= 0) {
      LOG(INFO) << "signal " << sig << ": member " << config.member
                << " of shard " << config.shard << " steps down and drains";
      ShutdownWithin(config.shutdown_grace + kDrainBudget,
                     [&member] { (*member)->Stop(); });
      return 0;
    }
    LOG(WARNING) << "shard " << config.shard << ": member " << config.member
                 << " ended; starting again";
    rc.held = (*member)->TakeHeldState();  // Its state, if it may lead.
    (*member)->Stop();
  }
}

int Run() {
  // Every flag is checked before any side effect.
  auto config = ConfigFromFlags();
  if (!config.ok()) {
    LOG(ERROR) << config.status().message();
    return 2;
  }
  LOG(INFO) << "shard " << config->shard << ": "
            << config->security.Describe(/*server=*/true);
  InstallStopSignalHandlers();
  if (config->replicated) {
    absl::StatusOr<EtcdTls> etcd_tls = EtcdTlsFromFlags();
    if (!etcd_tls.ok()) {
      LOG(ERROR) << etcd_tls.status();
      return 2;
    }
    return RunReplicated(*config, *etcd_tls);
  }
  auto server = ShardServer::Start(*config);
  if (!server.ok()) {
    LOG(ERROR) << server.status();
    // A flag that names something unusable is the caller's error, as a
    // malformed flag is.
    return server.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::printf("ps_server shard %d/%d data plane on port %d\n", config->shard,
              config->num_shards, (*server)->data_port());
  if (absl::Status s = WriteReadyFile(*config, **server); !s.ok()) {
    LOG(ERROR) << "--ready_file: " << s;
    (*server)->Shutdown();
    return 1;
  }
  std::printf("ps_server shard %d/%d listening on %s:%d\n", config->shard,
              config->num_shards, config->host.c_str(), (*server)->port());
  std::fflush(stdout);
  const int sig = WaitForStopOrDone(**server, config->shard);
  LOG(INFO) << (sig == 0 ? std::string("the job is done")
                         : absl::StrCat("signal ", sig))
            << ": draining shard " << config->shard
            << " (health NOT_SERVING, pushes refused, last checkpoint; a "
               "second signal exits at once)";
  // Every held call is answered by the drain; the budget is a last guard
  // (a call no path answers would hold gRPC's shutdown forever).
  ShutdownWithin(config->shutdown_grace + kDrainBudget, [&server] {
    (*server)->Drain();
    (*server)->Shutdown();
  });
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  asyncps::InitProgramFlags("ps_server",
                            "One shard of the asyncps parameter server.\n"
                            "  ps_server --port=5000 --shard=0 --num_shards=2");
  absl::ParseCommandLine(argc, argv);
  asyncps::KeepLargeBuffers();
  FLAGS_logtostderr = true;
  google::InitGoogleLogging(argv[0]);
  google::InstallFailureSignalHandler();  // SIGTERM: Run's, installed later.
  return asyncps::Run();
}
