// psctl: inspect a running asyncps cluster.
//
//   psctl --servers=h:p,h:p stats        every shard's Stats, as text
//   psctl --servers=h:p,h:p histogram    staleness histogram over all
//                                        shards, CSV "staleness,count"
//   psctl --servers=h:p,h:p workers      CSV
//   "shard,rank,clock,live,seconds_since_heard"
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/program_flags.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "proto/health.grpc.pb.h"
#include "rpc/grpc_credentials.h"
#include "tools/ops/psctl_doctor.h"
#include "tools/ops/psctl_export.h"
#include "tools/ops/psctl_group.h"
#include "tools/ops/psctl_status.h"
#include "tools/ops/timeline_merge.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:5000",
          "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(std::string, tag, "",
          "checkpoint: names the job checkpoint (default: t<unix seconds>).");
ABSL_FLAG(absl::Duration, watch, absl::ZeroDuration(),
          "status: refresh every this long until interrupted (0: once).");
ABSL_FLAG(bool, json, false, "status: the shards' Stats as JSON.");
ABSL_FLAG(std::string, out, "",
          "timeline: where the merged Chrome trace goes (timeline.json); "
          "export: the file to write (required).");
ABSL_FLAG(std::string, format, "npz",
          "export: the file's format; npz (numpy.load(FILE)[name]).");
ABSL_FLAG(std::string, plot, "",
          "timeline: also draw the last --plot_window of it to this PNG "
          "(gnuplot).");
ABSL_FLAG(absl::Duration, plot_window, absl::Seconds(1),
          "timeline: how much of the end of the run the picture shows.");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "Give up after the servers have been unreachable this long.");

namespace asyncps {
namespace {

// psctl timeline FILE...: merges, summarizes, and draws.
int TimelineCommand(const std::vector<std::string>& files) {
  if (files.empty()) {
    std::fprintf(stderr,
                 "usage: psctl timeline [--out=F] [--plot=F.png] FILE... (the "
                 "--timeline files of one run)\n");
    return 2;
  }
  auto merged = MergeTimelines(files);
  if (!merged.ok()) {
    std::fprintf(stderr, "psctl timeline: %s\n",
                 merged.status().ToString().c_str());
    return 2;
  }
  std::string out = absl::GetFlag(FLAGS_out);
  if (out.empty()) out = "timeline.json";
  std::FILE* f = std::fopen(out.c_str(), "w");
  if (f == nullptr ||
      std::fwrite(merged->json.data(), 1, merged->json.size(), f) !=
          merged->json.size() ||
      std::fclose(f) != 0) {
    std::fprintf(stderr, "psctl timeline: --out=%s: cannot write it\n",
                 out.c_str());
    return 1;
  }
  std::printf("%zu processes, %zu spans -> %s (chrome://tracing, Perfetto)\n",
              merged->processes.size(), merged->spans.size(), out.c_str());
  if (merged->dropped_lines > 0) {
    std::printf("(%lld cut last lines of killed processes left out)\n",
                static_cast<long long>(merged->dropped_lines));
  }
  std::fputs(Summarize(*merged).c_str(), stdout);
  const std::string png = absl::GetFlag(FLAGS_plot);
  if (png.empty()) return 0;
  const std::string script =
      PlotScript(*merged, absl::GetFlag(FLAGS_plot_window), png);
  std::FILE* gnuplot = popen("gnuplot", "w");
  if (gnuplot == nullptr) {
    std::fprintf(stderr, "psctl timeline: cannot run gnuplot\n");
    return 1;
  }
  std::fwrite(script.data(), 1, script.size(), gnuplot);
  if (pclose(gnuplot) != 0) {
    std::fprintf(stderr,
                 "psctl timeline: gnuplot failed drawing %s (is gnuplot "
                 "installed?)\n",
                 png.c_str());
    return 1;
  }
  std::printf("picture: %s\n", png.c_str());
  return 0;
}

// health: the standard grpc.health.v1 check of every shard; 0 if all serve.
int HealthCommand(const std::vector<ServerAddress>& servers,
                  const Security& security) {
  int serving = 0;
  for (size_t s = 0; s < servers.size(); ++s) {
    // The health service asks for no token (probes carry none).
    auto channel = grpc::CreateChannel(servers[s].ToString(),
                                       MakeChannelCredentials(security));
    auto stub = grpc::health::v1::Health::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_timeout)));
    grpc::health::v1::HealthCheckRequest req;
    grpc::health::v1::HealthCheckResponse resp;
    grpc::Status st = stub->Check(&ctx, req, &resp);
    const bool ok =
        st.ok() &&
        resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
    serving += ok;
    std::printf("shard %zu at %s: %s\n", s, servers[s].ToString().c_str(),
                st.ok()
                    ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                          resp.status())
                          .c_str()
                    : st.error_message().c_str());
  }
  return serving == static_cast<int>(servers.size()) ? 0 : 1;
}

// checkpoint: every shard at the same model version
// (AdminClient::JobCheckpoint).
int CheckpointCommand(AdminClient* admin) {
  std::string tag = absl::GetFlag(FLAGS_tag);
  if (tag.empty()) tag = absl::StrCat("t", absl::ToUnixSeconds(absl::Now()));
  auto paths = admin->JobCheckpoint(tag);
  if (!paths.ok()) {
    std::fprintf(stderr, "psctl: %s\n", paths.status().ToString().c_str());
    return 1;
  }
  for (size_t s = 0; s < paths->size(); ++s) {
    std::printf("shard %zu: %s\n", s, (*paths)[s].c_str());
  }
  std::printf("restore the whole job with ps_server --restore_job=%s\n",
              tag.c_str());
  return 0;
}

// status: --json, the shards' Stats for scripts; --watch, refreshed until
// killed.
int StatusCommand(AdminClient* admin, ShardCaller* caller) {
  const absl::Duration watch = absl::GetFlag(FLAGS_watch);
  std::vector<v1::StatsResponse> previous;
  while (true) {
    auto stats = admin->StatsAll();
    if (!stats.ok()) {
      std::fprintf(stderr, "psctl: %s\n", stats.status().ToString().c_str());
      return 1;
    }
    if (absl::GetFlag(FLAGS_json)) {
      std::string out = "[";
      for (size_t s = 0; s < stats->size(); ++s) {
        std::string one;
        (void)google::protobuf::util::MessageToJsonString((*stats)[s], &one);
        absl::StrAppend(&out, s ? "," : "", one);
      }
      std::printf("%s]\n", out.c_str());
    } else {
      if (watch > absl::ZeroDuration()) std::printf("\033[H\033[2J");
      PrintStatus(*stats, previous);
      PrintGroups(admin, caller);
    }
    std::fflush(stdout);
    if (watch <= absl::ZeroDuration()) return 0;
    previous = *std::move(stats);
    absl::SleepFor(watch);
  }
}

// The commands that read the shards' Stats once: stats, histogram,
// workers.
int StatsCommand(const std::string& command, AdminClient* admin) {
  if (command != "stats" && command != "histogram" && command != "workers") {
    std::fprintf(stderr,
                 "psctl: unknown command '%s' (want status, doctor, stats, "
                 "histogram, workers, checkpoint, export or health)\n",
                 command.c_str());
    return 2;
  }
  auto stats = admin->StatsAll();
  if (!stats.ok()) {
    std::fprintf(stderr, "psctl: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  if (command == "stats") {
    for (const auto& s : *stats) {
      std::printf("# shard %u\n%s\n", s.shard(), s.DebugString().c_str());
    }
  } else if (command == "histogram") {
    PrintHistogram(*stats);
  } else {
    PrintWorkers(*stats);
  }
  return 0;
}

int Run(const std::string& command) {
  auto servers = ParseServerList(absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) {
    std::fprintf(stderr, "psctl: --servers: %s\n",
                 servers.status().ToString().c_str());
    return 2;
  }
  std::vector<Finding> etcd_findings;
  if (command == "doctor") {
    // --etcd: the shards are found there, not in --servers.
    auto job = EtcdJobFromFlags();
    if (!job.ok()) {
      std::fprintf(stderr, "psctl: %s\n", job.status().ToString().c_str());
      return 2;
    }
    if (job->has_value()) {
      etcd_findings = (*job)->findings;
      if ((*job)->servers.empty()) return PrintFindings(etcd_findings);
      *servers = (*job)->servers;
    }
  }
  auto security = LoadSecurity(SecurityFlagsFromCommandLine());
  if (!security.ok()) {
    std::fprintf(stderr, "psctl: %s\n", security.status().ToString().c_str());
    return 2;
  }
  PsClientOptions options;
  options.servers = *servers;
  options.security = *security;
  options.transport = Transport::kGrpc;  // Stats and control calls only.
  options.rpc_timeout = absl::GetFlag(FLAGS_timeout);
  options.retry_for = absl::GetFlag(FLAGS_timeout);
  if (command == "doctor") {  // Its answer within 10 s, every call at once.
    options.rpc_timeout = options.retry_for =
        std::min(options.rpc_timeout, absl::Seconds(3));
  }
  auto client = PsClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "psctl: %s\n", client.status().ToString().c_str());
    return 2;
  }
  AdminClient admin((*client)->caller());
  if (command == "health") return HealthCommand(*servers, *security);
  if (command == "export") {
    return ExportCommand(client->get(), &admin, absl::GetFlag(FLAGS_format),
                         absl::GetFlag(FLAGS_out));
  }
  if (command == "checkpoint") return CheckpointCommand(&admin);
  if (command == "doctor") {
    return DoctorCommand(&admin, *servers, security->tls(), etcd_findings);
  }
  if (command == "status") return StatusCommand(&admin, (*client)->caller());
  return StatsCommand(command, &admin);
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  asyncps::InitProgramFlags(
      "psctl",
      "Inspect a running asyncps cluster.\n"
      "  psctl --servers=h:p,h:p COMMAND\n"
      "  status      every shard and worker on one screen (--watch, --json)\n"
      "  health      grpc.health.v1 of every shard; exit 0 if all serve\n"
      "  doctor      what keeps the job from training, in plain words\n"
      "              (within 10 s); exit 0 if nothing does\n"
      "  checkpoint  a job checkpoint: every shard at one model version\n"
      "              (--tag; restore with ps_server --restore_job)\n"
      "  export      every tensor by name, as the servers hold it now, to\n"
      "              --out=FILE (--format=npz: numpy.load(FILE)[name])\n"
      "  stats       every shard's Stats, in full\n"
      "  histogram   the staleness histogram, summed over shards (CSV)\n"
      "  workers     every shard's view of every worker (CSV)\n"
      "  psctl doctor --etcd=H:P --job=NAME\n"
      "              the same for a replicated job found in etcd: its\n"
      "              records there too (etcd down, no group, no primary)\n"
      "  psctl group init --etcd=H:P --job=NAME --num_shards=N\n"
      "              create a new job's replicated groups in etcd (once;\n"
      "              or ps_server --bootstrap on one member of each)\n"
      "  psctl timeline [--out=F] [--plot=F.png] FILE...\n"
      "              merge a run's --timeline files into one Chrome trace,\n"
      "              say where each process's time went, draw the end");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() >= 2 && std::string(args[1]) == "group") {
    return asyncps::GroupCommand(
        std::vector<std::string>(args.begin() + 2, args.end()));
  }
  if (args.size() >= 2 && std::string(args[1]) == "timeline") {
    return asyncps::TimelineCommand(
        std::vector<std::string>(args.begin() + 2, args.end()));
  }
  if (args.size() != 2) {
    std::fprintf(stderr,
                 "usage: psctl --servers=h:p,... "
                 "status|doctor|health|checkpoint|export|stats|histogram|"
                 "workers, or "
                 "psctl timeline FILE... (psctl --help)\n");
    return 2;
  }
  return asyncps::Run(args[1]);
}
