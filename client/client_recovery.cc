// Client::Impl::Recover (client/client_impl.h): a shard that restarted
// without a checkpoint gets the model back from this worker's weights.
#include <algorithm>

#include "client/client_impl.h"
#include "common/backoff.h"
#include "common/status.h"
#include "glog/logging.h"

namespace asyncps {

absl::Status Client::Impl::Recover(
    const absl::Status& failure, const std::vector<absl::Span<float>>& weights,
    Snapshot* snapshot) {
  if (failure.code() != absl::StatusCode::kFailedPrecondition) {
    return failure;
  }
  const int n = NumTensors();
  if (n == 0) return failure;
  RETURN_IF_ERROR(CheckWholeModel(weights));
  std::vector<int> all(n);
  for (int t = 0; t < n; ++t) all[t] = t;
  std::vector<SliceVersion>& versions = snapshot->rep_->versions;
  versions.resize(ps_->partition().slices().size());
  ASSIGN_OR_RETURN(const PsClient::ModelPresence presence, ps_->Presence());
  const std::vector<int>& lost = presence.lost;
  if (lost.empty()) {
    // Another worker may have declared the model again meanwhile: then a
    // shard's incarnation is not the one our weights came from.
    std::vector<std::vector<float>> fresh(n);
    for (int t = 0; t < n; ++t) fresh[t].resize(weights[t].size());
    std::vector<SliceVersion> fresh_versions;
    RETURN_IF_ERROR(ps_->Pull(all, &fresh, &fresh_versions, -1, 0));
    bool restarted = false;
    for (size_t i = 0; i < versions.size() && i < fresh_versions.size(); ++i) {
      restarted |= versions[i].incarnation != 0 &&
                   versions[i].incarnation != fresh_versions[i].incarnation;
    }
    if (!restarted) return failure;
    for (int t = 0; t < n; ++t) {
      std::copy(fresh[t].begin(), fresh[t].end(), weights[t].begin());
    }
    versions.swap(fresh_versions);
    return absl::OkStatus();
  }
  const ConstTensorViews held(weights.begin(), weights.end());
  for (int shard : lost) {
    if ((presence.trained || JobTrained()) && !PulledFrom(shard, versions)) {
      ASSIGN_OR_RETURN(const bool restored, AwaitRestoreByAnother(shard));
      if (restored) continue;
      LOG(WARNING) << "shard " << shard
                   << " lost the model and no worker that pulled its "
                      "weights restored it within "
                   << absl::FormatDuration(kAwaitRestore)
                   << ": this worker's copy, never pulled, is all there is";
    }
    ASSIGN_OR_RETURN(const bool created, ps_->Redeclare(shard));
    if (!created) continue;  // Another worker restores it.
    LOG(WARNING) << "shard " << shard
                 << " restarted without the model: restoring it from rank "
                 << rank() << "'s copy";
    absl::Status restored = ps_->Restore(shard, held, versions, rank());
    // FAILED_PRECONDITION: the shard stopped waiting (--restore_wait).
    if (!restored.ok() &&
        restored.code() != absl::StatusCode::kFailedPrecondition) {
      return restored;
    }
  }
  // As no worker (rank -1): a restored shard's steps and clocks must not
  // hold this pull.
  const TensorViews views(weights.begin(), weights.end());
  return ps_->Pull(all, views, &versions, -1, 0);
}

bool Client::Impl::PulledFrom(int shard,
                              const std::vector<SliceVersion>& versions) const {
  const std::vector<SliceInfo>& slices = ps_->partition().slices();
  for (size_t i = 0; i < slices.size() && i < versions.size(); ++i) {
    if (slices[i].shard == shard && versions[i].incarnation != 0) return true;
  }
  return false;
}

absl::StatusOr<bool> Client::Impl::AwaitRestoreByAnother(int shard) {
  Backoff backoff(absl::Milliseconds(20), absl::Milliseconds(500),
                  kAwaitRestore);
  while (backoff.Wait()) {
    ASSIGN_OR_RETURN(const PsClient::ModelPresence presence, ps_->Presence());
    if (std::find(presence.lost.begin(), presence.lost.end(), shard) ==
        presence.lost.end()) {
      return true;
    }
  }
  return false;
}

absl::Status Client::Impl::Recover(
    const absl::Status& failure,
    const std::vector<absl::Span<float>>& weights) {
  Snapshot own = latest();
  RETURN_IF_ERROR(Recover(failure, weights, &own));
  absl::MutexLock lock(&mu_);
  versions_ = own.rep_->versions;
  return absl::OkStatus();
}

}  // namespace asyncps
