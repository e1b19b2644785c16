// psctl: inspect a running asyncps cluster.
//
//   psctl --servers=h:p,h:p stats        every shard's Stats, as text
//   psctl --servers=h:p,h:p histogram    staleness histogram over all
//                                        shards, CSV "staleness,count"
//   psctl --servers=h:p,h:p workers      CSV
//   "shard,rank,clock,live,seconds_since_heard"
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/admin_client.h"
#include "client/embedding_client.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "common/partitioner.h"
#include "common/program_flags.h"
#include "common/security.h"
#include "common/security_flags.h"
#include "common/status_macros.h"
#include "proto/health.grpc.pb.h"
#include "rpc/grpc_credentials.h"
#include "tools/npz_writer.h"
#include "tools/timeline_merge.h"

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

// psctl status, replicated shards (--servers=a|b,...): each group's
// members as each member sees itself.
void PrintGroups(AdminClient* admin, ShardCaller* caller) {
  bool replicated = false;
  for (int s = 0; s < caller->num_shards(); ++s) {
    replicated |= caller->num_members(s) > 1;
  }
  if (!replicated) return;
  std::printf("%-5s %-22s %-8s %6s %9s %6s %12s  %s\n", "shard", "member",
              "role", "epoch", "applied", "lag", "replicated", "backups");
  for (int s = 0; s < caller->num_shards(); ++s) {
    for (int m = 0; m < caller->num_members(s); ++m) {
      const std::string address = caller->member_address(s, m).ToString();
      auto stats = admin->MemberStats(s, m);
      if (!stats.ok()) {
        std::printf("%-5d %-22s %-8s %s\n", s, address.c_str(), "DOWN",
                    std::string(stats.status().message()).c_str());
        continue;
      }
      const v1::ReplicaStats& r = stats->replica();
      std::printf(
          "%-5d %-22s %-8s %6lld %9llu %6llu %11.1fM  %s\n", s, address.c_str(),
          r.role().c_str(), static_cast<long long>(r.epoch()),
          static_cast<unsigned long long>(r.applied_seq()),
          static_cast<unsigned long long>(r.lag()), r.replicated_bytes() / 1e6,
          absl::StrJoin(r.backups(), ",").c_str());
    }
  }
}

// psctl status: every shard and every worker on one screen. `previous`
// (may be empty) is the last refresh's answer, for rates.
void PrintStatus(const std::vector<v1::StatsResponse>& stats,
                 const std::vector<v1::StatsResponse>& previous) {
  if (stats.empty()) return;
  std::printf("asyncps: %zu shards, mode %s, model '%s'\n", stats.size(),
              stats[0].mode().c_str(), stats[0].model_name().c_str());
  std::printf("%-5s %-16s %7s %9s %15s %11s %5s %9s %10s\n", "shard",
              "incarnation", "slices", "MiB", "versions", "updates/s", "live",
              "uptime", "checkpoint");
  for (size_t s = 0; s < stats.size(); ++s) {
    const v1::StatsResponse& r = stats[s];
    double rate =
        r.uptime_seconds() > 0 ? r.updates_applied() / r.uptime_seconds() : 0.0;
    if (s < previous.size() && previous[s].incarnation() == r.incarnation() &&
        r.uptime_seconds() > previous[s].uptime_seconds()) {
      rate = (r.updates_applied() - previous[s].updates_applied()) /
             (r.uptime_seconds() - previous[s].uptime_seconds());
    }
    const std::string checkpoint =
        r.checkpoint_age_seconds() < 0
            ? "none"
            : absl::StrFormat("%.0fs ago", r.checkpoint_age_seconds());
    std::printf(
        "%-5u %016llx %7u %9.2f %7lld..%-7lld %11.1f %5d %8.0fs %10s%s\n",
        r.shard(), static_cast<unsigned long long>(r.incarnation()),
        r.num_slices(), r.num_bytes() / 1048576.0,
        static_cast<long long>(r.min_version()),
        static_cast<long long>(r.max_version()), rate, r.live_workers(),
        r.uptime_seconds(), checkpoint.c_str(),
        r.awaiting_restore() ? "  awaiting a worker's copy" : "");
    if (!r.stall().empty()) {
      std::printf("      stalled: %s\n", r.stall().c_str());
    }
  }
  // A worker as the shards see it: the freshest report of any shard.
  std::map<int, v1::WorkerInfo> workers;
  for (const auto& r : stats) {
    for (const auto& w : r.workers()) {
      auto it = workers.find(w.rank());
      if (it == workers.end() ||
          w.seconds_since_heard() < it->second.seconds_since_heard()) {
        workers[w.rank()] = w;
      }
    }
  }
  std::printf("%-5s %-20s %9s %9s %5s %10s %10s %8s %22s\n", "rank", "host",
              "clock", "staleness", "live", "last seen", "samples/s", "loss",
              "data/compute/exchange");
  for (const auto& [rank, w] : workers) {
    const v1::WorkerProgress& p = w.progress();
    const double total =
        p.data_seconds() + p.compute_seconds() + p.exchange_seconds();
    auto share = [total](double s) { return total > 0 ? 100 * s / total : 0; };
    std::printf(
        "%-5d %-20s %9lld %9.2f %5s %9.1fs %10.0f %8.4f "
        "%6.0f%%/%3.0f%%/%3.0f%%\n",
        rank, w.host().c_str(), static_cast<long long>(w.clock()),
        p.staleness(), w.live() ? "yes" : "NO", w.seconds_since_heard(),
        p.samples_per_second(), p.loss(), share(p.data_seconds()),
        share(p.compute_seconds()), share(p.exchange_seconds()));
  }
  // Embedding tables, summed over the shards (each holds the ids RowShard
  // gives it).
  std::map<std::string, v1::EmbeddingStats> tables;
  for (const auto& r : stats) {
    for (const auto& e : r.embeddings()) {
      v1::EmbeddingStats& t = tables[e.name()];
      t.set_dim(e.dim());
      t.set_rows(t.rows() + e.rows());
      t.set_evicted(t.evicted() + e.evicted());
      t.set_rows_pulled(t.rows_pulled() + e.rows_pulled());
      t.set_rows_pushed(t.rows_pushed() + e.rows_pushed());
      t.set_bytes_received(t.bytes_received() + e.bytes_received());
      t.set_bytes_sent(t.bytes_sent() + e.bytes_sent());
    }
  }
  if (tables.empty()) return;
  std::printf("%-20s %6s %12s %12s %14s %14s %10s %10s\n", "embedding", "dim",
              "rows", "evicted", "rows pulled", "rows pushed", "MB in",
              "MB out");
  for (const auto& [name, t] : tables) {
    std::printf("%-20s %6lld %12lld %12lld %14lld %14lld %10.1f %10.1f\n",
                name.c_str(), static_cast<long long>(t.dim()),
                static_cast<long long>(t.rows()),
                static_cast<long long>(t.evicted()),
                static_cast<long long>(t.rows_pulled()),
                static_cast<long long>(t.rows_pushed()),
                t.bytes_received() / 1e6, t.bytes_sent() / 1e6);
  }
}

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

// The dense model's tensors into `npz`, by name (a reader's pull: no step
// waits for it).
absl::Status ExportModel(PsClient* client, NpzWriter* npz) {
  RETURN_IF_ERROR(client->FetchModel());
  const v1::ModelSpec& spec = client->spec();
  std::vector<int> all(spec.tensors_size());
  std::vector<std::vector<float>> values(spec.tensors_size());
  for (int t = 0; t < spec.tensors_size(); ++t) {
    all[t] = t;
    ASSIGN_OR_RETURN(const uint64_t n, NumElements(spec.tensors(t)));
    values[t].resize(n);
  }
  std::vector<SliceVersion> versions;
  RETURN_IF_ERROR(client->Pull(all, &values, &versions, -1, 0));
  for (int t = 0; t < spec.tensors_size(); ++t) {
    const v1::TensorSpec& tensor = spec.tensors(t);
    std::vector<int64_t> shape(tensor.shape().begin(), tensor.shape().end());
    RETURN_IF_ERROR(npz->Add(tensor.name(), shape, values[t]));
  }
  return absl::OkStatus();
}

// Each embedding table the shards hold into `npz`: NAME (rows x dim,
// float32) and NAME.ids (int64), row k of NAME being id NAME.ids[k].
absl::StatusOr<int> ExportTables(PsClient* client,
                                 const std::vector<v1::StatsResponse>& stats,
                                 NpzWriter* npz) {
  std::map<std::string, int64_t> dims;  // Every shard holds every table.
  for (const auto& r : stats) {
    for (const auto& e : r.embeddings()) dims[e.name()] = e.dim();
  }
  EmbeddingClient tables(client->caller());
  for (const auto& [name, dim] : dims) {
    std::vector<int64_t> ids;
    std::vector<float> rows;
    RETURN_IF_ERROR(tables.ReadAll(name, &ids, &rows));
    const int64_t n = static_cast<int64_t>(ids.size());
    RETURN_IF_ERROR(npz->Add(name, {n, dim}, rows));
    RETURN_IF_ERROR(npz->Add(name + ".ids", {n}, ids));
  }
  return static_cast<int>(dims.size());
}

// psctl export --format=npz --out=FILE: every tensor of the running
// model and every row of each embedding table, by name, as the servers
// hold them now (a reader's reads: no step waits for them). Written to
// FILE.tmp, then renamed.
int ExportCommand(PsClient* client, AdminClient* admin) {
  const std::string format = absl::GetFlag(FLAGS_format);
  const std::string out = absl::GetFlag(FLAGS_out);
  if (format != "npz") {
    std::fprintf(stderr, "psctl export: --format=%s (only npz is built)\n",
                 format.c_str());
    return 2;
  }
  if (out.empty()) {
    std::fprintf(stderr, "psctl export: --out=FILE is required\n");
    return 2;
  }
  absl::StatusOr<std::vector<v1::StatsResponse>> stats = admin->StatsAll();
  if (!stats.ok()) {
    std::fprintf(stderr, "psctl export: %s\n",
                 stats.status().ToString().c_str());
    return 1;
  }
  // A job of embedding tables alone declares no dense model.
  const bool dense = (*stats)[0].model_declared();
  NpzWriter npz;
  if (absl::Status s = dense ? ExportModel(client, &npz) : absl::OkStatus();
      !s.ok()) {
    std::fprintf(stderr, "psctl export: %s\n", s.ToString().c_str());
    return 1;
  }
  absl::StatusOr<int> tables = ExportTables(client, *stats, &npz);
  if (!tables.ok()) {
    std::fprintf(stderr, "psctl export: %s\n",
                 tables.status().ToString().c_str());
    return 1;
  }
  if (!dense && *tables == 0) {
    std::fprintf(stderr,
                 "psctl export: the shards hold no model and no embedding "
                 "table yet\n");
    return 1;
  }
  const std::string bytes = npz.Finish();
  const std::string tmp = out + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  const bool written =
      f != nullptr &&
      std::fwrite(bytes.data(), 1, bytes.size(), f) == bytes.size();
  if (f != nullptr && std::fclose(f) != 0) f = nullptr;
  if (!written || f == nullptr || std::rename(tmp.c_str(), out.c_str()) != 0) {
    std::fprintf(stderr, "psctl export: cannot write %s: %s\n", out.c_str(),
                 std::strerror(errno));
    std::remove(tmp.c_str());
    return 1;
  }
  std::printf(
      "exported model '%s': %d tensors, %d embedding tables, %zu "
      "bytes, to %s\n",
      dense ? client->spec().name().c_str() : "",
      dense ? client->spec().tensors_size() : 0, *tables, bytes.size(),
      out.c_str());
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

// histogram: the staleness histogram summed over the shards, as CSV.
void PrintHistogram(const std::vector<v1::StatsResponse>& stats) {
  std::vector<int64_t> sum;
  for (const auto& s : stats) {
    if (sum.size() < static_cast<size_t>(s.staleness_histogram_size())) {
      sum.resize(s.staleness_histogram_size(), 0);
    }
    for (int k = 0; k < s.staleness_histogram_size(); ++k) {
      sum[k] += s.staleness_histogram(k);
    }
  }
  std::printf("staleness,count\n");
  for (size_t k = 0; k < sum.size(); ++k) {
    std::printf("%zu,%lld\n", k, static_cast<long long>(sum[k]));
  }
}

// workers: every shard's view of every worker, as CSV.
void PrintWorkers(const std::vector<v1::StatsResponse>& stats) {
  std::printf("shard,rank,clock,live,seconds_since_heard\n");
  for (const auto& s : stats) {
    for (const auto& w : s.workers()) {
      std::printf("%u,%d,%lld,%d,%.3f\n", s.shard(), w.rank(),
                  static_cast<long long>(w.clock()), w.live() ? 1 : 0,
                  w.seconds_since_heard());
    }
  }
}

// The commands that read the shards' Stats once: stats, histogram,
// workers.
int StatsCommand(const std::string& command, AdminClient* admin) {
  if (command != "stats" && command != "histogram" && command != "workers") {
    std::fprintf(stderr,
                 "psctl: unknown command '%s' (want status, stats, "
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
  auto client = PsClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "psctl: %s\n", client.status().ToString().c_str());
    return 2;
  }
  AdminClient admin((*client)->caller());
  if (command == "health") return HealthCommand(*servers, *security);
  if (command == "export") return ExportCommand(client->get(), &admin);
  if (command == "checkpoint") return CheckpointCommand(&admin);
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
      "  checkpoint  a job checkpoint: every shard at one model version\n"
      "              (--tag; restore with ps_server --restore_job)\n"
      "  export      every tensor by name, as the servers hold it now, to\n"
      "              --out=FILE (--format=npz: numpy.load(FILE)[name])\n"
      "  stats       every shard's Stats, in full\n"
      "  histogram   the staleness histogram, summed over shards (CSV)\n"
      "  workers     every shard's view of every worker (CSV)\n"
      "  psctl timeline [--out=F] [--plot=F.png] FILE...\n"
      "              merge a run's --timeline files into one Chrome trace,\n"
      "              say where each process's time went, draw the end");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() >= 2 && std::string(args[1]) == "timeline") {
    return asyncps::TimelineCommand(
        std::vector<std::string>(args.begin() + 2, args.end()));
  }
  if (args.size() != 2) {
    std::fprintf(stderr,
                 "usage: psctl --servers=h:p,... "
                 "status|health|checkpoint|export|stats|histogram|workers, or "
                 "psctl timeline FILE... (psctl --help)\n");
    return 2;
  }
  return asyncps::Run(args[1]);
}
