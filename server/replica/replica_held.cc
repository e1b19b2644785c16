// A primary fenced for its lease keeps its state across its member's
// restart (server/replica/replica_member.h, ReplicaConfig::held): the
// ended member's snapshot in memory, taken back by the member started in
// its place before its first round.
#include <memory>
#include <utility>
#include <vector>

#include "glog/logging.h"
#include "server/replica/replica_member.h"

namespace asyncps {

std::shared_ptr<const HeldState> ReplicaMember::TakeHeldState() {
  if (!lease_lost_ || server_ == nullptr) return nullptr;
  Replication* r = server_->replication();
  absl::StatusOr<std::vector<v1::ReplicaOp>> ops = r->SnapshotOps();
  if (!ops.ok()) {
    LOG(WARNING) << "shard " << shard_ << ": member " << member_
                 << " cannot keep the state it held: " << ops.status();
    return nullptr;
  }
  auto held = std::make_shared<HeldState>();
  held->epoch = r->epoch();
  held->snapshot = *std::move(ops);
  return held;
}

void ReplicaMember::TakeBack(const HeldState& held) {
  Replication* r = server_->replication();
  r->BecomeBackup(held.epoch, "");
  for (const v1::ReplicaOp& op : held.snapshot) {
    v1::ReplicaOp copy = op;
    if (absl::Status s = r->Apply(&copy); !s.ok()) {
      LOG(WARNING) << "shard " << shard_ << ": cannot take back the state "
                   << "held as the primary of epoch " << held.epoch << " (" << s
                   << "); the member starts empty";
      return;
    }
  }
  held_epoch_ = held.epoch;
  LOG(WARNING) << "shard " << shard_ << ": member " << r->member()
               << " holds the state it had as the primary of epoch "
               << held.epoch << ", and may lead the group again while no "
               << "later epoch began";
}

}  // namespace asyncps
