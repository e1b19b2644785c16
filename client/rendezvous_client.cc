#include "client/rendezvous_client.h"

#include <algorithm>
#include <utility>

#include "common/status.h"

namespace asyncps {

absl::Status RendezvousClient::SetOnShard0(const std::string& key,
                                           const std::string& value) {
  v1::StoreSetRequest req;
  req.set_key(key);
  req.set_value(value);
  return caller_
      ->CallOne<v1::StoreSetResponse>(0, req, ASYNCPS_RPC(StoreSet), "StoreSet",
                                      /*idempotent=*/true)
      .status();
}

absl::Status RendezvousClient::StoreSet(const std::string& key,
                                        const std::string& value) {
  RETURN_IF_ERROR(SetOnShard0(key, value));
  absl::MutexLock lock(&sets_mu_);
  auto same = std::find_if(sets_.begin(), sets_.end(),
                           [&key](const auto& kv) { return kv.first == key; });
  if (same != sets_.end()) sets_.erase(same);
  if (sets_.size() >= kRememberedSets) sets_.erase(sets_.begin());
  sets_.emplace_back(key, value);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RendezvousClient::StoreGet(const std::string& key,
                                                       absl::Duration wait) {
  const absl::Time deadline = caller_->options().clock->Now() + wait;
  while (true) {
    const absl::Duration left = deadline - caller_->options().clock->Now();
    v1::StoreGetRequest req;
    req.set_key(key);
    req.set_wait_ms(absl::ToInt64Milliseconds(
        std::max(absl::ZeroDuration(), std::min(left, absl::Seconds(1)))));
    absl::StatusOr<v1::StoreGetResponse> resp =
        caller_->CallOne<v1::StoreGetResponse>(0, req, ASYNCPS_RPC(StoreGet),
                                               "StoreGet");
    if (resp.ok()) return resp->value();
    if (resp.status().code() != absl::StatusCode::kDeadlineExceeded ||
        caller_->options().clock->Now() >= deadline) {
      return resp.status();
    }
    // Not set yet: perhaps set before shard 0 restarted, by a rank that is
    // itself waiting for ours. Ours again (the others do the same).
    std::vector<std::pair<std::string, std::string>> mine;
    {
      absl::MutexLock lock(&sets_mu_);
      mine = sets_;
    }
    for (const auto& [k, v] : mine) RETURN_IF_ERROR(SetOnShard0(k, v));
  }
}

}  // namespace asyncps
