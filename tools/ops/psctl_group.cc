#include "tools/ops/psctl_group.h"

#include <algorithm>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/replica/etcd_coordinator.h"
#include "server/replica/etcd_flags.h"
#include "server/replica/group_records.h"

ABSL_FLAG(std::string, etcd, "",
          "group init, doctor: etcd's client address (host:port), as the "
          "members' --etcd (doctor: finds the job's shards there instead of "
          "--servers).");
ABSL_FLAG(std::string, job, "default",
          "group init, doctor: the job's name, as the members' --job.");
ABSL_FLAG(int, num_shards, 0,
          "group init: the job's shards, as the members' --num_shards.");
ABSL_FLAG(absl::Duration, etcd_timeout, absl::Seconds(5),
          "group init: how long one etcd call may take.");

namespace asyncps {
namespace {

// Where the job's records live in etcd, as the members' --job puts them.
std::string JobPrefix() {
  return absl::StrCat("/asyncps/", absl::GetFlag(FLAGS_job));
}

}  // namespace

int GroupCommand(const std::vector<std::string>& args) {
  if (args.size() != 1 || args[0] != "init") {
    std::fprintf(stderr,
                 "usage: psctl group init --etcd=HOST:PORT --job=NAME "
                 "--num_shards=N\n");
    return 2;
  }
  const std::string etcd = absl::GetFlag(FLAGS_etcd);
  const int shards = absl::GetFlag(FLAGS_num_shards);
  if (etcd.empty() || shards < 1) {
    std::fprintf(stderr,
                 "psctl group init: needs --etcd (host:port) and "
                 "--num_shards (>= 1), as the members were given\n");
    return 2;
  }
  absl::StatusOr<EtcdTls> tls = EtcdTlsFromFlags();
  if (!tls.ok()) {
    std::fprintf(stderr, "psctl group init: %s\n",
                 tls.status().ToString().c_str());
    return 2;
  }
  EtcdCoordinator coordinator(etcd, absl::GetFlag(FLAGS_etcd_timeout), *tls);
  const std::string prefix = JobPrefix();
  for (int s = 0; s < shards; ++s) {
    absl::StatusOr<bool> created = CreateGroup(&coordinator, prefix, s);
    if (!created.ok()) {
      std::fprintf(stderr, "psctl group init: shard %d: %s\n", s,
                   created.status().ToString().c_str());
      return 1;
    }
    std::printf("shard %d: %s\n", s,
                *created ? "group created (epoch 0: any member may lead it)"
                         : "has its records already; left as it is");
  }
  return 0;
}

absl::StatusOr<std::optional<EtcdJob>> EtcdJobFromFlags() {
  const std::string etcd = absl::GetFlag(FLAGS_etcd);
  if (etcd.empty()) return std::nullopt;
  ASSIGN_OR_RETURN(const EtcdTls tls, EtcdTlsFromFlags());
  EtcdCoordinator coordinator(
      etcd, std::min(absl::GetFlag(FLAGS_etcd_timeout), absl::Seconds(3)), tls);
  return ReadEtcdJob(&coordinator, etcd, JobPrefix());
}

}  // namespace asyncps
