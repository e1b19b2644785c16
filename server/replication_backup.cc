// The backup's side of replication: a joining member takes the primary's
// snapshot (ApplySnapshot), then applies the stream's ops in order (Apply).
// The primary's side (the order of pushes, streaming them to backups and
// sending a joining backup its snapshot) is in replication.cc.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/checkpoint.pb.h"
#include "server/replica_snapshot.h"
#include "server/replication.h"

namespace asyncps {
namespace {

ShardStore::StepAdvance FromProto(const v1::ReplicaSteps& p) {
  ShardStore::StepAdvance a;
  a.fast_forward_to = p.fast_forward_to();
  a.quorum = p.quorum();
  a.live_workers = p.live_workers();
  a.deadline = absl::Nanoseconds(p.deadline_nanos());
  a.now = absl::FromUnixNanos(p.now_unix_nanos());
  a.heal = p.heal();
  a.live_ranks.assign(p.live_ranks().begin(), p.live_ranks().end());
  a.stuck.insert(p.stuck().begin(), p.stuck().end());
  a.heal_after = absl::Nanoseconds(p.heal_after_nanos());
  return a;
}

}  // namespace

absl::Status Replication::ApplyPush(const v1::ReplicaOp& op) {
  const v1::PushRequest& push = op.push();
  v1::PushResponse response;
  const PushLedger::Verdict verdict = ledger_->Begin(push, &response);
  if (verdict != PushLedger::Verdict::kApply) {
    return absl::FailedPreconditionError(
        absl::StrCat("push ", push.sequence(), " of client ", push.client_id(),
                     " streamed twice"));
  }
  PushPolicy policy = base_policy_;
  policy.quorum = op.quorum();
  policy.live_workers = op.live_workers();
  policy.now = absl::FromUnixNanos(op.now_unix_nanos());
  absl::Status s = store_->Push(push, policy, &response);
  ledger_->Finish(push, s, response);
  RETURN_IF_ERROR(s);
  // The worker is heard from, at its clock (as the primary's Authorize
  // noted): a promoted backup knows who pushed last and where.
  if (membership_ != nullptr) membership_->Touch(push.rank(), push.clock());
  return absl::OkStatus();
}

absl::Status Replication::ApplyTableOp(const v1::ReplicaOp& op) {
  if (tables_ == nullptr) {
    return absl::FailedPreconditionError(
        "the primary streamed an embedding table to a member without tables");
  }
  if (op.has_declare_embedding()) {
    return tables_->Declare(op.declare_embedding().spec());
  }
  const v1::PushRowsRequest& push = op.push_rows();
  RowPolicy policy;
  policy.bsp = base_policy_.mode == Mode::kBsp;
  policy.quorum = op.quorum();
  policy.now = absl::FromUnixNanos(op.now_unix_nanos());
  v1::PushRowsResponse response;
  bool applied = false;
  RETURN_IF_ERROR(ServePushRows(tables_, store_->shard(), num_shards_, push,
                                &response, policy, &applied));
  if (membership_ != nullptr) membership_->Touch(push.rank(), push.clock());
  if (!applied) {
    return absl::FailedPreconditionError(
        absl::StrCat("push of rows ", push.sequence(), " of client ",
                     push.client_id(), " streamed twice"));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> Replication::ApplySnapshot(v1::ReplicaOp* op) {
  switch (op->op_case()) {
    case v1::ReplicaOp::kSnapshot: {
      const v1::ReplicaSnapshot& s = op->snapshot();
      if (s.incarnation() != store_->incarnation()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the primary's incarnation is ", s.incarnation(),
                         ", this ", "backup's ", store_->incarnation()));
      }
      if (joining_ != nullptr) {
        return absl::FailedPreconditionError("a second snapshot started");
      }
      joining_ = std::make_unique<SnapshotIn>(store_, tables_, s);
      joining_membership_ = s.membership();
      return false;
    }
    case v1::ReplicaOp::kSnapshotChunk:
      if (joining_ == nullptr) {
        return absl::FailedPreconditionError(
            "a snapshot chunk before the snapshot's start");
      }
      RETURN_IF_ERROR(joining_->Chunk(op->snapshot_chunk()));
      return false;
    case v1::ReplicaOp::kSnapshotEnd: {
      if (joining_ == nullptr) {
        return absl::FailedPreconditionError(
            "a snapshot's end before its start");
      }
      std::unique_ptr<SnapshotIn> in = std::move(joining_);
      RETURN_IF_ERROR(in->End(op->snapshot_end(), ledger_));
      if (membership_ != nullptr) membership_->Import(joining_membership_);
      return true;
    }
    default:
      return absl::InternalError("not a snapshot op");
  }
}

absl::Status Replication::Apply(v1::ReplicaOp* op) {
  absl::MutexLock order(&order_mu_);
  {
    absl::ReaderMutexLock lock(&mu_);
    if (role_ != Role::kJoining && role_ != Role::kBackup) {
      return absl::FailedPreconditionError(absl::StrCat(
          "member ", member_, " is ", RoleName(role_), ", not a backup"));
    }
    if (op->epoch() != epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("an op of epoch ", op->epoch(), " where this backup ",
                       "follows epoch ", epoch_));
    }
    const bool snapshot = op->op_case() == v1::ReplicaOp::kSnapshot ||
                          op->op_case() == v1::ReplicaOp::kSnapshotChunk ||
                          op->op_case() == v1::ReplicaOp::kSnapshotEnd;
    if (snapshot != (role_ == Role::kJoining) ||
        (!snapshot && op->seq() != applied_ + 1)) {
      return absl::FailedPreconditionError(
          absl::StrCat("op ", op->seq(), " out of order (applied: ", applied_,
                       ", ", RoleName(role_), ")"));
    }
  }
  switch (op->op_case()) {
    case v1::ReplicaOp::kSnapshot:
    case v1::ReplicaOp::kSnapshotChunk:
    case v1::ReplicaOp::kSnapshotEnd: {
      absl::StatusOr<bool> whole = ApplySnapshot(op);
      if (!whole.ok()) joining_.reset();  // The member joins again afresh.
      RETURN_IF_ERROR(whole.status());
      if (!*whole) {
        absl::MutexLock lock(&mu_);
        bytes_ += static_cast<int64_t>(op->ByteSizeLong());
        return absl::OkStatus();
      }
      break;
    }
    case v1::ReplicaOp::kPush:
      RETURN_IF_ERROR(ApplyPush(*op));
      break;
    case v1::ReplicaOp::kMembership:
      if (membership_ != nullptr) membership_->Import(op->membership());
      break;
    case v1::ReplicaOp::kDeclare:
      RETURN_IF_ERROR(store_->Declare(op->declare().spec()).status());
      break;
    case v1::ReplicaOp::kSteps:
      AdvanceShardSteps(store_, tables_, FromProto(op->steps()));
      break;
    case v1::ReplicaOp::kDeclareEmbedding:
    case v1::ReplicaOp::kPushRows:
      RETURN_IF_ERROR(ApplyTableOp(*op));
      break;
    case v1::ReplicaOp::kAssign:
      RETURN_IF_ERROR(op->assign().load_state()
                          ? store_->LoadState(op->assign())
                          : store_->Assign(op->assign(), op->steps_unknown()));
      break;
    default:
      return absl::InvalidArgumentError("an op with nothing in it");
  }
  absl::MutexLock lock(&mu_);
  applied_ = op->seq();
  bytes_ += static_cast<int64_t>(op->ByteSizeLong());
  if (role_ == Role::kJoining) role_ = Role::kBackup;
  return absl::OkStatus();
}

}  // namespace asyncps
