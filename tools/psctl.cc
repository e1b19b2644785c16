// psctl: inspect a running asyncps cluster.
//
//   psctl --servers=h:p,h:p stats        every shard's Stats, as text
//   psctl --servers=h:p,h:p histogram    staleness histogram over all
//                                        shards, CSV "staleness,count"
//   psctl --servers=h:p,h:p workers      CSV
//   "shard,rank,clock,live,seconds_since_heard"
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/ps_client.h"
#include "common/cluster_spec.h"
#include "proto/health.grpc.pb.h"

ABSL_FLAG(std::string, servers, "127.0.0.1:5000",
          "Comma-separated host:port of every shard, shard 0 first.");
ABSL_FLAG(std::string, tag, "",
          "checkpoint: names the job checkpoint (default: t<unix seconds>).");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "Give up after the servers have been unreachable this long.");

namespace asyncps {
namespace {

int Run(const std::string& command) {
  auto servers = ParseServerList(absl::GetFlag(FLAGS_servers));
  if (!servers.ok()) {
    std::fprintf(stderr, "psctl: --servers: %s\n",
                 servers.status().ToString().c_str());
    return 2;
  }
  PsClientOptions options;
  options.servers = *servers;
  options.rpc_timeout = absl::GetFlag(FLAGS_timeout);
  options.retry_for = absl::GetFlag(FLAGS_timeout);
  auto client = PsClient::Create(options);
  if (!client.ok()) {
    std::fprintf(stderr, "psctl: %s\n", client.status().ToString().c_str());
    return 2;
  }
  if (command == "health") {
    // The standard grpc.health.v1 check of every shard: 0 if all serve.
    int serving = 0;
    for (size_t s = 0; s < servers->size(); ++s) {
      auto channel = grpc::CreateChannel((*servers)[s].ToString(),
                                         grpc::InsecureChannelCredentials());
      auto stub = grpc::health::v1::Health::NewStub(channel);
      grpc::ClientContext ctx;
      ctx.set_deadline(
          std::chrono::system_clock::now() +
          absl::ToChronoMilliseconds(absl::GetFlag(FLAGS_timeout)));
      grpc::health::v1::HealthCheckRequest req;
      grpc::health::v1::HealthCheckResponse resp;
      grpc::Status st = stub->Check(&ctx, req, &resp);
      const bool ok =
          st.ok() &&
          resp.status() == grpc::health::v1::HealthCheckResponse::SERVING;
      serving += ok;
      std::printf(
          "shard %zu at %s: %s\n", s, (*servers)[s].ToString().c_str(),
          st.ok() ? grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
                        resp.status())
                        .c_str()
                  : st.error_message().c_str());
    }
    return serving == static_cast<int>(servers->size()) ? 0 : 1;
  }
  if (command == "checkpoint") {
    // Every shard at the same model version (PsClient::JobCheckpoint).
    std::string tag = absl::GetFlag(FLAGS_tag);
    if (tag.empty()) tag = absl::StrCat("t", absl::ToUnixSeconds(absl::Now()));
    auto paths = (*client)->JobCheckpoint(tag);
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
  auto stats = (*client)->StatsAll();
  if (!stats.ok()) {
    std::fprintf(stderr, "psctl: %s\n", stats.status().ToString().c_str());
    return 1;
  }
  if (command == "stats") {
    for (const auto& s : *stats) {
      std::printf("# shard %u\n%s\n", s.shard(), s.DebugString().c_str());
    }
  } else if (command == "histogram") {
    std::vector<int64_t> sum;
    for (const auto& s : *stats) {
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
  } else if (command == "workers") {
    std::printf("shard,rank,clock,live,seconds_since_heard\n");
    for (const auto& s : *stats) {
      for (const auto& w : s.workers()) {
        std::printf("%u,%d,%lld,%d,%.3f\n", s.shard(), w.rank(),
                    static_cast<long long>(w.clock()), w.live() ? 1 : 0,
                    w.seconds_since_heard());
      }
    }
  } else {
    std::fprintf(stderr,
                 "psctl: unknown command '%s' (want stats, histogram, "
                 "workers, checkpoint or health)\n",
                 command.c_str());
    return 2;
  }
  return 0;
}

}  // namespace
}  // namespace asyncps

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Inspect a running asyncps cluster.\n"
      "  psctl --servers=h:p,h:p stats|histogram|workers|checkpoint|health");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() != 2) {
    std::fprintf(stderr,
                 "usage: psctl --servers=h:p,... stats|histogram|workers\n");
    return 2;
  }
  return asyncps::Run(args[1]);
}
