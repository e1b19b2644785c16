// ShardServerConfig's checks (server/shard_server.h): each flag that is
// wrong named in an INVALID_ARGUMENT before anything starts.
#include "absl/strings/str_cat.h"
#include "common/cluster_spec.h"
#include "common/status_macros.h"
#include "server/checkpoint_format.h"
#include "server/shard_server.h"

namespace asyncps {

namespace {

// The flags of a replicated group's member (ps_server --replicas).
absl::Status CheckGroup(const ShardServerConfig& c) {
  if (c.replicated && (c.host.empty() || c.data_port < 0)) {
    return absl::InvalidArgumentError(
        "--replicas needs a data plane (--data_port is not -1)");
  }
  if (c.replicated && (c.security.tls() || !c.security.token.empty()) &&
      c.security.member_token.empty()) {
    return absl::InvalidArgumentError(
        "--replicas with TLS or --auth_token_file needs --member_token_file: "
        "without the members' own credential any holder of a worker's "
        "token or certificate could join the group as a backup");
  }
  if (!c.replicated && !c.security.member_token.empty()) {
    return absl::InvalidArgumentError(
        "--member_token_file needs --replicas: only a group's members join");
  }
  if (c.replicated && c.consistency.stale.kind == StalePolicy::kCompensate) {
    return absl::InvalidArgumentError(
        "--stale_policy=dc with --replicas is not built yet: the window of "
        "recent weights it compensates with is not carried to a joining "
        "backup, which would then apply pushes differently");
  }
  if (c.min_insync < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--min_insync=", c.min_insync, " must be at least 1 (the primary)"));
  }
  return absl::OkStatus();
}

// The job's workers: --num_workers.
absl::Status CheckWorkers(const ShardServerConfig& c) {
  if (c.num_workers < 0 || c.num_workers > kMaxRank) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--num_workers=", c.num_workers, " is outside [0, ", kMaxRank, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ShardServerConfig::Validate() const {
  if (num_shards < 1 || shard < 0 || shard >= num_shards) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--shard=", shard, " must be in [0, --num_shards=", num_shards, ")"));
  }
  if (port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--port=", port, " is not a TCP port"));
  }
  RETURN_IF_ERROR(CheckGroup(*this));
  if (data_port < -1 || data_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data_port=", data_port, " is not a TCP port (-1: no data plane)"));
  }
  if (metrics_port < 0 || metrics_port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_port=", metrics_port, " is not a TCP port (0: none)"));
  }
  if (max_data_connections < 1) {
    return absl::InvalidArgumentError(
        "--max_data_connections must be at least 1");
  }
  if (max_data_connections_per_client < 1) {
    return absl::InvalidArgumentError(
        "--max_data_connections_per_client must be at least 1");
  }
  if (max_streams_per_connection < 1) {
    return absl::InvalidArgumentError(
        "--max_streams_per_connection must be at least 1");
  }
  if (rejoin_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--rejoin_grace must not be negative");
  }
  RETURN_IF_ERROR(CheckWorkers(*this));
  if (max_message_bytes < 2 * kResponseOverhead ||
      max_message_bytes > (int64_t{1} << 31) - 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_message_bytes=", max_message_bytes, " must be in [",
                     2 * kResponseOverhead, ", 2^31 - 1]"));
  }
  if (join_backlog_bytes < 1) {
    return absl::InvalidArgumentError("--join_backlog_bytes must be positive");
  }
  if (max_shard_bytes < 1) {
    return absl::InvalidArgumentError("--max_shard_bytes must be positive");
  }
  if (worker_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--worker_timeout must be positive");
  }
  if (!restore_job.empty()) {
    if (checkpoint_dir.empty()) {
      return absl::InvalidArgumentError(
          "--restore_job needs the --checkpoint_dir it was written to");
    }
    if (absl::Status tag = CheckJobTag(restore_job); !tag.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--restore_job: ", tag.message()));
    }
  }
  if (!checkpoint_dir.empty() && checkpoint_keep < 1) {
    return absl::InvalidArgumentError("--checkpoint_keep must be at least 1");
  }
  if (checkpoint_every < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "--checkpoint_every must not be negative");
  }
  if (shutdown_grace < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown_grace must not be negative");
  }
  if (tick <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("the housekeeping tick must be positive");
  }
  return consistency.Validate();
}

std::string DefaultMember(const std::string& host, int port) {
  const bool any = host.empty() || host == "0.0.0.0" || host == "::";
  return ServerAddress{any ? "127.0.0.1" : host, port, {}}.ToString();
}

}  // namespace asyncps
