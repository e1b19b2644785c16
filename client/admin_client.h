// AdminClient: what operators and psctl ask of a running cluster, beside
// training: every shard's statistics, and checkpoints (one shard's now, or
// the job's, at the same model version on every shard). Calls go through a
// ShardCaller (client/shard_caller.h), e.g. a PsClient's.
#ifndef ASYNCPS_CLIENT_ADMIN_CLIENT_H_
#define ASYNCPS_CLIENT_ADMIN_CLIENT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/shard_caller.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

class AdminClient {
 public:
  // `caller` is borrowed and must outlive this client.
  explicit AdminClient(ShardCaller* caller) : caller_(caller) {}

  absl::StatusOr<v1::StatsResponse> Stats(int shard);
  // Stats of member `member` of a replicated `shard` (no retry).
  absl::StatusOr<v1::StatsResponse> MemberStats(int shard, int member);
  // Stats of every shard, in shard order.
  absl::StatusOr<std::vector<v1::StatsResponse>> StatsAll();
  // Asks a shard to write a checkpoint now; returns the file's path there.
  absl::StatusOr<std::string> Checkpoint(int shard);
  // A job checkpoint: every shard written at the same model version (bsp:
  // the same applied step on every slice; async/ssp: with no update applied
  // anywhere between the first file and the last), as "job-<tag>-shard-
  // <i>.ckpt"; returns the paths in shard order. Pushes wait (retried by
  // the workers) for at most the time this takes; the shards resume by
  // themselves after `lease` should this client die meanwhile.
  absl::StatusOr<std::vector<std::string>> JobCheckpoint(
      const std::string& tag, absl::Duration lease = absl::Seconds(60));

 private:
  ShardCaller* const caller_;
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_ADMIN_CLIENT_H_
