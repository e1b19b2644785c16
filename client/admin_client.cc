#include "client/admin_client.h"

#include <algorithm>
#include <utility>

#include "common/backoff.h"
#include "common/status.h"

namespace asyncps {

absl::StatusOr<std::vector<v1::StatsResponse>> AdminClient::StatsAll() {
  std::vector<ShardCall<v1::StatsRequest, v1::StatsResponse>> calls(
      caller_->num_shards());
  for (int s = 0; s < caller_->num_shards(); ++s) calls[s].shard = s;
  RETURN_IF_ERROR(caller_->CallAll(&calls, ASYNCPS_RPC(Stats), "Stats"));
  std::vector<v1::StatsResponse> out;
  for (auto& c : calls) out.push_back(std::move(c.response));
  return out;
}

absl::StatusOr<v1::StatsResponse> AdminClient::MemberStats(int shard,
                                                           int member) {
  return caller_->CallMember<v1::StatsResponse>(
      shard, member, v1::StatsRequest(), ASYNCPS_RPC(Stats));
}

absl::StatusOr<v1::StatsResponse> AdminClient::Stats(int shard) {
  return caller_->CallOne<v1::StatsResponse>(shard, v1::StatsRequest(),
                                             ASYNCPS_RPC(Stats), "Stats");
}

absl::StatusOr<std::vector<std::string>> AdminClient::JobCheckpoint(
    const std::string& tag, absl::Duration lease) {
  using Calls =
      std::vector<ShardCall<v1::CheckpointRequest, v1::CheckpointResponse>>;
  auto to_all = [this](v1::CheckpointRequest request,
                       Calls* calls) -> absl::Status {
    calls->assign(caller_->num_shards(), {});
    for (int s = 0; s < caller_->num_shards(); ++s) {
      (*calls)[s].shard = s;
      (*calls)[s].request = request;
    }
    return caller_->CallAll(calls, ASYNCPS_RPC(Checkpoint), "Checkpoint",
                            /*idempotent=*/true);
  };
  v1::CheckpointRequest pause;
  pause.set_phase(v1::CheckpointRequest::PAUSE);
  pause.set_lease_ms(absl::ToInt64Milliseconds(lease));
  Calls calls;
  absl::Status s = to_all(pause, &calls);
  std::vector<std::string> paths;
  if (s.ok()) {
    // bsp: let the newest step any shard applied complete everywhere
    // (pushes for later steps wait). Elsewhere min == max is not asked for:
    // with every push held, nothing changes while the files are written.
    int64_t front = 0;
    for (const auto& c : calls) front = std::max(front, c.response.max_step());
    pause.set_until_step(front);
    Backoff backoff(absl::Milliseconds(5), absl::Milliseconds(100), lease,
                    caller_->options().clock);
    bool bsp = false;
    auto stats = Stats(0);
    if (stats.ok()) bsp = stats->mode() == "bsp";
    while (s.ok() && bsp) {
      s = to_all(pause, &calls);
      bool behind = false;
      for (const auto& c : calls) behind |= c.response.min_step() < front;
      if (!s.ok() || !behind) break;
      if (!backoff.Wait()) {
        s = absl::DeadlineExceededError(absl::StrCat(
            "step ", front, " did not complete on every shard within ",
            absl::FormatDuration(lease)));
      }
    }
  }
  if (s.ok()) {
    v1::CheckpointRequest write;
    write.set_phase(v1::CheckpointRequest::WRITE);
    write.set_tag(tag);
    s = to_all(write, &calls);
    for (const auto& c : calls) paths.push_back(c.response.path());
  }
  v1::CheckpointRequest resume;
  resume.set_phase(v1::CheckpointRequest::RESUME);
  Calls resumed;
  absl::Status r = to_all(resume, &resumed);
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(r);
  return paths;
}

absl::StatusOr<std::string> AdminClient::Checkpoint(int shard) {
  ASSIGN_OR_RETURN(v1::CheckpointResponse resp,
                   caller_->CallOne<v1::CheckpointResponse>(
                       shard, v1::CheckpointRequest(), ASYNCPS_RPC(Checkpoint),
                       "Checkpoint"));
  return resp.path();
}

}  // namespace asyncps
