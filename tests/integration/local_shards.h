// Test helper: n in-process ShardServers listening on 127.0.0.1 (ports the
// kernel picks), for tests that need real gRPC between a client and shards
// but no child processes.
#ifndef ASYNCPS_TESTS_INTEGRATION_LOCAL_SHARDS_H_
#define ASYNCPS_TESTS_INTEGRATION_LOCAL_SHARDS_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_spec.h"
#include "server/shard_server.h"

namespace asyncps::testing {

struct LocalShards {
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<ServerAddress> addresses;  // Shard i at addresses[i].
};

// `tweak`, if given, adjusts each shard's config before it starts.
inline absl::StatusOr<LocalShards> StartLocalShards(
    int n, const std::function<void(ShardServerConfig*)>& tweak = nullptr) {
  LocalShards shards;
  for (int s = 0; s < n; ++s) {
    ShardServerConfig config;
    config.host = "127.0.0.1";
    config.shard = s;
    config.num_shards = n;
    if (tweak) tweak(&config);
    auto server = ShardServer::Start(config);
    if (!server.ok()) return server.status();
    shards.addresses.push_back(ServerAddress{"127.0.0.1", (*server)->port()});
    shards.servers.push_back(*std::move(server));
  }
  return shards;
}

// Shard `s` of `shards` killed and started again, in process: the same
// address (a new data port), no members, and no model unless `tweak` (as
// given to StartLocalShards) names a checkpoint directory to restore from.
inline absl::Status RestartLocalShard(
    LocalShards* shards, int s,
    const std::function<void(ShardServerConfig*)>& tweak = nullptr) {
  ShardServerConfig config;
  config.host = "127.0.0.1";
  config.shard = s;
  config.num_shards = static_cast<int>(shards->servers.size());
  if (tweak) tweak(&config);
  config.port = shards->servers[s]->port();
  shards->servers[s]->Shutdown();
  auto server = ShardServer::Start(config);
  if (!server.ok()) return server.status();
  shards->servers[s] = *std::move(server);
  return absl::OkStatus();
}

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_LOCAL_SHARDS_H_
