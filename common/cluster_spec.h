// The cluster spec: where the shards listen (`--servers=h:p,h:p,...`).
#ifndef ASYNCPS_COMMON_CLUSTER_SPEC_H_
#define ASYNCPS_COMMON_CLUSTER_SPEC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

struct ServerAddress {
  std::string host;
  int port = 0;
  // A replicated shard's other members (ps_server --replicas), which a
  // client tries in turn when this one is not the primary; empty for a
  // shard of one process.
  std::vector<ServerAddress> others;
  std::string ToString() const;  // "host:port", IPv6 hosts bracketed.
  // The shard's members: this one, then `others`.
  std::vector<ServerAddress> Members() const;
};

// Parses "host:port,host:port,...": shard i is the i-th entry. Hosts may be
// names, IPv4, or bracketed IPv6 ("[::1]:5000"). An entry may list a
// replicated shard's members as "host:port|host:port" (any one of them may
// be the primary). INVALID_ARGUMENT names the bad entry: empty list,
// missing port, port outside 1-65535, duplicates.
absl::StatusOr<std::vector<ServerAddress>> ParseServerList(
    absl::string_view list);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CLUSTER_SPEC_H_
