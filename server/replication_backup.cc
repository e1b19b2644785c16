// The backup's side of replication: a joining member takes the primary's
// snapshot (ApplySnapshot), then applies the stream's ops in order (Apply).
// The primary's side (the order of pushes, streaming them to backups and
// sending a joining backup its snapshot) is in replication.cc.
#include <deque>
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
  a.not_sending.stuck.insert(p.stuck().begin(), p.stuck().end());
  a.not_sending.done.insert(p.done().begin(), p.done().end());
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
      joining_seq_ = op->seq();
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

namespace {

bool IsSnapshotOp(const v1::ReplicaOp& op) {
  return op.op_case() == v1::ReplicaOp::kSnapshot ||
         op.op_case() == v1::ReplicaOp::kSnapshotChunk ||
         op.op_case() == v1::ReplicaOp::kSnapshotEnd;
}

}  // namespace

absl::Status Replication::KeepForLater(v1::ReplicaOp* op) {
  if (joining_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("op ", op->seq(), " before the snapshot's start"));
  }
  const uint64_t due = joining_seq_ + backlog_.size() + 1;
  if (op->seq() != due) {
    return absl::FailedPreconditionError(absl::StrCat(
        "op ", op->seq(), " out of order while joining (due: ", due, ")"));
  }
  backlog_bytes_ += op->ByteSizeLong();
  if (backlog_bytes_ > join_backlog_bytes_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the ops that came while the snapshot did passed ",
                     join_backlog_bytes_, " bytes; the member joins again"));
  }
  backlog_.push_back(std::move(*op));
  return absl::OkStatus();
}

absl::Status Replication::Apply(v1::ReplicaOp* op,
                                std::optional<uint64_t>* ack) {
  absl::MutexLock order(&order_mu_);
  const bool snapshot = IsSnapshotOp(*op);
  bool joining;
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
    joining = role_ == Role::kJoining;
    if ((snapshot && !joining) || (!joining && op->seq() != applied_ + 1)) {
      return absl::FailedPreconditionError(
          absl::StrCat("op ", op->seq(), " out of order (applied: ", applied_,
                       ", ", RoleName(role_), ")"));
    }
  }
  auto forget = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_) {
    joining_.reset();  // The member joins again afresh.
    backlog_.clear();
    backlog_bytes_ = 0;
  };
  if (!snapshot) {
    if (joining) {
      absl::Status s = KeepForLater(op);
      if (!s.ok()) forget();
      return s;
    }
    RETURN_IF_ERROR(ApplyOp(op));
    absl::MutexLock lock(&mu_);
    applied_ = op->seq();
    bytes_ += static_cast<int64_t>(op->ByteSizeLong());
    if (ack != nullptr) *ack = applied_;
    return absl::OkStatus();
  }
  absl::StatusOr<bool> whole = ApplySnapshot(op);
  if (!whole.ok()) forget();
  RETURN_IF_ERROR(whole.status());
  {
    absl::MutexLock lock(&mu_);
    bytes_ += static_cast<int64_t>(op->ByteSizeLong());
    if (!*whole) return absl::OkStatus();
    applied_ = op->seq();
    role_ = Role::kBackup;
  }
  // In place: then the ops that came meanwhile, in order.
  std::deque<v1::ReplicaOp> later;
  later.swap(backlog_);
  backlog_bytes_ = 0;
  for (v1::ReplicaOp& next : later) {
    RETURN_IF_ERROR(ApplyOp(&next));
    absl::MutexLock lock(&mu_);
    applied_ = next.seq();
    bytes_ += static_cast<int64_t>(next.ByteSizeLong());
  }
  absl::ReaderMutexLock lock(&mu_);
  if (ack != nullptr) *ack = applied_;
  return absl::OkStatus();
}

absl::Status Replication::ApplyOp(v1::ReplicaOp* op) {
  switch (op->op_case()) {
    case v1::ReplicaOp::kPush:
      return ApplyPush(*op);
    case v1::ReplicaOp::kMembership:
      if (membership_ != nullptr) membership_->Import(op->membership());
      return absl::OkStatus();
    case v1::ReplicaOp::kDeclare:
      return store_->Declare(op->declare().spec()).status();
    case v1::ReplicaOp::kSteps:
      AdvanceShardSteps(store_, tables_, FromProto(op->steps()));
      return absl::OkStatus();
    case v1::ReplicaOp::kDeclareEmbedding:
    case v1::ReplicaOp::kPushRows:
      return ApplyTableOp(*op);
    case v1::ReplicaOp::kAssign:
      return op->assign().load_state()
                 ? store_->LoadState(op->assign())
                 : store_->Assign(op->assign(), op->steps_unknown());
    default:
      return absl::InvalidArgumentError("an op with nothing in it");
  }
}

}  // namespace asyncps
