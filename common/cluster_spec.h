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
  std::string ToString() const;  // "host:port", IPv6 hosts bracketed.
};

// Parses "host:port,host:port,...": shard i is the i-th entry. Hosts may be
// names, IPv4, or bracketed IPv6 ("[::1]:5000"). INVALID_ARGUMENT names the
// bad entry: empty list, missing port, port outside 1-65535, duplicates.
absl::StatusOr<std::vector<ServerAddress>> ParseServerList(
    absl::string_view list);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_CLUSTER_SPEC_H_
