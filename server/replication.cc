// The primary's side of replication (server/replication.h): the order of
// writes (Push, Declare, Assign, Register, DeclareEmbedding, PushRows,
// AdvanceSteps), each applied and written to every backup under the order
// lock and answered once acknowledged. The stream itself and a joining
// backup's snapshot are in replication_stream.cc; roles, the lease and
// the checks before a write in replication_roles.cc; the backup's apply of
// the stream in replication_backup.cc.
#include "server/replication.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {
absl::Status Replication::Push(const v1::PushRequest& request,
                               const PushPolicy& policy,
                               v1::PushResponse* response) {
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CheckWritable());
    RETURN_IF_ERROR(store_->Push(request, policy, response));
    // The answer is recorded under the order lock, with the effect: a
    // snapshot (taken under it) holds both or neither, so a backup that
    // joins now and is promoted answers the client's retry instead of
    // applying it again. (Consistency::Push records it again, the same.)
    // A retry answered from it meanwhile waits for this op's
    // acknowledgements (AwaitStreamed).
    ledger_->Finish(request, absl::OkStatus(), *response);
    v1::ReplicaOp op;
    // The request travels as it is: its tensors go from its buffers to the
    // sockets (WriteFrame leaves it unchanged), not through a copy.
    op.set_allocated_push(const_cast<v1::PushRequest*>(&request));
    op.set_quorum(policy.quorum);
    op.set_live_workers(policy.live_workers);
    op.set_now_unix_nanos(absl::ToUnixNanos(policy.now));
    sent = Broadcast(&op);
    // Back to its owner, the caller (not freed with `op`).
    (void)op.release_push();
  }
  AwaitAcks(sent);
  // Acknowledged only within the lease: past it a backup may have been
  // promoted without this push, and the client must ask the new primary
  // (whose ledger knows the push if it got it). Below min_insync (a backup
  // dropped out of this op's stream) the push stays applied and its answer
  // recorded, but Consistency::Push does not acknowledge it, nor a retry,
  // until a backup that joins holds it.
  return CheckServing();
}

absl::StatusOr<v1::DeclareModelResponse> Replication::Declare(
    const v1::DeclareModelRequest& request) {
  Sent sent;
  v1::DeclareModelResponse response;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CheckWritable());
    ASSIGN_OR_RETURN(response, store_->Declare(request.spec()));
    if (response.created()) {
      v1::ReplicaOp op;
      *op.mutable_declare()->mutable_spec() = request.spec();
      sent = Broadcast(&op);
    } else {
      sent = Streamed();
    }
  }
  AwaitAcks(sent);
  // A declaration is idempotent: one below min_insync is declared again.
  RETURN_IF_ERROR(CheckWritable());
  return response;
}

absl::Status Replication::Assign(const v1::AssignRequest& request,
                                 bool steps_unknown) {
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CheckWritable());
    RETURN_IF_ERROR(request.load_state()
                        ? store_->LoadState(request)
                        : store_->Assign(request, steps_unknown));
    v1::ReplicaOp op;
    op.set_allocated_assign(const_cast<v1::AssignRequest*>(&request));
    op.set_steps_unknown(steps_unknown);
    sent = Broadcast(&op);
    (void)op.release_assign();
  }
  AwaitAcks(sent);
  // An assignment is a whole state: one below min_insync is sent again.
  return CheckWritable();
}

absl::StatusOr<v1::RegisterResponse> Replication::Register(
    const v1::RegisterRequest& request) {
  // Not held to min_insync: a registration lost with its primary costs
  // the worker a registration again (its heartbeat's NOT_FOUND), not a
  // weight; and below min_insync reads go on, which need one.
  Sent sent;
  v1::RegisterResponse response;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CheckServing());
    ASSIGN_OR_RETURN(response, membership_->Register(request));
    sent = BroadcastMembership();
  }
  AwaitAcks(sent);
  RETURN_IF_ERROR(CheckServing());
  return response;
}

void Replication::MembershipChanged() {
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    if (!CheckServing().ok()) return;
    sent = BroadcastMembership();
  }
  AwaitAcks(sent);
}

Replication::Sent Replication::BroadcastMembership() {
  v1::ReplicaOp op;
  *op.mutable_membership() = membership_->Export();
  return Broadcast(&op);
}

absl::Status Replication::CheckTables() const {
  if (tables_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError("this shard serves no embedding tables");
}

absl::Status Replication::DeclareEmbedding(const v1::EmbeddingSpec& spec,
                                           const absl::Status& may_create) {
  RETURN_IF_ERROR(CheckTables());
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CheckWritable());
    const bool there = tables_->Find(spec.name()).ok();
    RETURN_IF_ERROR(tables_->Declare(spec, may_create));
    if (!there) {
      v1::ReplicaOp op;
      *op.mutable_declare_embedding()->mutable_spec() = spec;
      sent = Broadcast(&op);
    } else {
      sent = Streamed();
    }
  }
  AwaitAcks(sent);
  // A declaration is idempotent: one below min_insync is declared again.
  return CheckWritable();
}

absl::Status Replication::PushRows(const v1::PushRowsRequest& request,
                                   const RowPolicy& policy,
                                   v1::PushRowsResponse* response) {
  RETURN_IF_ERROR(CheckTables());
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CheckWritable());
    bool applied = false;
    // The ledger records the answer here, under the order lock, with the
    // effect: a snapshot holds both or neither.
    RETURN_IF_ERROR(ServePushRows(tables_, store_->shard(), num_shards_,
                                  request, response, policy, &applied));
    if (applied) {
      v1::ReplicaOp op;
      op.set_allocated_push_rows(const_cast<v1::PushRowsRequest*>(&request));
      op.set_quorum(policy.quorum);
      op.set_now_unix_nanos(absl::ToUnixNanos(policy.now));
      sent = Broadcast(&op);
      (void)op.release_push_rows();  // Back to its owner, the caller.
    } else {
      // A retry answered from the rows' ledger: its first copy's op may
      // still be on its way.
      sent = Streamed();
    }
  }
  AwaitAcks(sent);
  // As Push: acknowledged only within the lease, and (a retry answered
  // from the ledger too) only while min_insync members hold it.
  return CheckWritable();
}

namespace {

v1::ReplicaSteps ToProto(const ShardStore::StepAdvance& a) {
  v1::ReplicaSteps p;
  p.set_fast_forward_to(a.fast_forward_to);
  p.set_quorum(a.quorum);
  p.set_live_workers(a.live_workers);
  p.set_deadline_nanos(absl::ToInt64Nanoseconds(a.deadline));
  p.set_now_unix_nanos(absl::ToUnixNanos(a.now));
  p.set_heal(a.heal);
  for (int r : a.live_ranks) p.add_live_ranks(r);
  for (int r : a.not_sending.stuck) p.add_stuck(r);
  for (const auto& [r, step] : a.not_sending.done)
    (*p.mutable_done())[r] = step;
  p.set_heal_after_nanos(absl::ToInt64Nanoseconds(a.heal_after));
  return p;
}
}  // namespace

ShardStore::StepsAdvanced Replication::AdvanceSteps(
    const ShardStore::StepAdvance& advance) {
  ShardStore::StepsAdvanced done;
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    if (!CheckServing().ok()) return {};
    done = AdvanceShardSteps(store_, tables_, advance);
    if (!done.changed()) return done;
    v1::ReplicaOp op;
    *op.mutable_steps() = ToProto(advance);
    sent = Broadcast(&op);
  }
  // The steps' results are answered (held pulls) once the backups hold
  // them.
  AwaitAcks(sent);
  return done;
}

}  // namespace asyncps
