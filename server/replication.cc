// The primary's side of replication (server/replication.h): the order of
// writes (Push, Declare, Assign, DeclareEmbedding, PushRows, AdvanceSteps),
// each streamed to every
// backup and acknowledged before it is answered, and a joining backup's
// snapshot (SendSnapshot, ServeBackup). Roles, the lease and the checks
// before a write are in replication_roles.cc; the backup's apply of the
// stream in replication_backup.cc.
#include "server/replication.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint_stream.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps {
namespace {

// An acknowledgement is a few bytes; anything bigger breaks the stream.
constexpr uint64_t kMaxAckBytes = 4096;
// Each op of a snapshot (a chunk, or the end, when the backup puts the
// whole in place) gets at least this long to be written and acknowledged.
constexpr absl::Duration kSnapshotTimeout = absl::Seconds(60);

// Reads a backup's acknowledgement of op `seq`.
absl::Status ReadAck(Stream* stream, uint64_t seq, absl::Time deadline) {
  ASSIGN_OR_RETURN(FrameHeader header,
                   ReadHeader(stream, kMaxAckBytes, deadline));
  if (header.op != FrameOp::kAnswer) {
    return absl::InvalidArgumentError("a backup sent a request, not an ack");
  }
  if (header.code != 0) {
    absl::Status refused;
    RETURN_IF_ERROR(ReadError(stream, header, deadline, &refused));
    return refused;
  }
  v1::ReplicaAck ack;
  RETURN_IF_ERROR(ReadBody(
      stream, header, &ack, [&] { return PayloadFields(&ack); }, deadline));
  if (ack.seq() != seq) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a backup acknowledged op ", ack.seq(), " where ", seq, " was due"));
  }
  return absl::OkStatus();
}

absl::Status WriteOp(Stream* stream, v1::ReplicaOp* op, absl::Time deadline) {
  FrameHeader header;
  header.op = FrameOp::kReplicate;
  return WriteFrame(stream, header, op, PayloadFields(op), deadline);
}

}  // namespace

void Replication::Broadcast(v1::ReplicaOp* op) {
  op->set_seq(++seq_);
  {
    absl::ReaderMutexLock lock(&mu_);
    op->set_epoch(epoch_);
  }
  const absl::Time deadline = absl::Now() + ack_timeout_;
  const int64_t op_bytes = static_cast<int64_t>(op->ByteSizeLong());
  bool dropped = false;
  auto drop = [&](Backup& b, const absl::Status& why) {
    LOG(WARNING) << "shard " << store_->shard() << ": dropping backup "
                 << b.member << " (op " << op->seq() << "): " << why;
    dropped = true;
    b.dropped = true;
    ShutdownSocket(b.stream->fd());
  };
  // Every backup gets the op before any is waited for, so they apply it
  // side by side.
  for (Backup& b : backups_) {
    if (b.dropped) continue;
    if (absl::Status s = WriteOp(b.stream, op, deadline); !s.ok()) drop(b, s);
  }
  int64_t bytes = 0;
  for (Backup& b : backups_) {
    if (b.dropped) continue;
    if (absl::Status s = ReadAck(b.stream, op->seq(), deadline); !s.ok()) {
      drop(b, s);
    } else {
      bytes += op_bytes;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    applied_ = seq_;
    bytes_ += bytes;
  }
  if (dropped) NoteBackups();
}

void Replication::NoteBackups() {
  std::vector<std::string> names;
  for (const Backup& b : backups_) {
    if (!b.dropped) names.push_back(b.member);
  }
  {
    absl::MutexLock lock(&mu_);
    backup_names_ = names;
  }
  if (!backups_changed_) return;
  if (absl::Status s = backups_changed_(names); !s.ok()) {
    absl::MutexLock lock(&mu_);
    if (role_ == Role::kFenced) return;
    LOG(WARNING) << "shard " << store_->shard() << " member " << member_
                 << " stops serving: cannot record its backups: " << s;
    role_ = Role::kFenced;
  }
}

absl::Status Replication::Push(const v1::PushRequest& request,
                               const PushPolicy& policy,
                               v1::PushResponse* response) {
  absl::MutexLock order(&order_mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(store_->Push(request, policy, response));
  // The answer is recorded under the order lock, with the effect: a
  // snapshot (taken under it) holds both or neither, so a backup that
  // joins now and is promoted answers the client's retry instead of
  // applying it again. (Consistency::Push records it again, the same.)
  ledger_->Finish(request, absl::OkStatus(), *response);
  v1::ReplicaOp op;
  // The request travels as it is: its tensors go from its buffers to the
  // sockets (WriteFrame leaves it unchanged), not through a copy.
  op.set_allocated_push(const_cast<v1::PushRequest*>(&request));
  op.set_quorum(policy.quorum);
  op.set_live_workers(policy.live_workers);
  op.set_now_unix_nanos(absl::ToUnixNanos(policy.now));
  Broadcast(&op);
  // Back to its owner, the caller (not freed with `op`).
  (void)op.release_push();
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
  absl::MutexLock order(&order_mu_);
  RETURN_IF_ERROR(CheckWritable());
  ASSIGN_OR_RETURN(v1::DeclareModelResponse response,
                   store_->Declare(request.spec()));
  if (response.created()) {
    v1::ReplicaOp op;
    *op.mutable_declare()->mutable_spec() = request.spec();
    Broadcast(&op);
  }
  // A declaration is idempotent: one below min_insync is declared again.
  RETURN_IF_ERROR(CheckWritable());
  return response;
}

absl::Status Replication::Assign(const v1::AssignRequest& request,
                                 bool steps_unknown) {
  absl::MutexLock order(&order_mu_);
  RETURN_IF_ERROR(CheckWritable());
  RETURN_IF_ERROR(request.load_state()
                      ? store_->LoadState(request)
                      : store_->Assign(request, steps_unknown));
  v1::ReplicaOp op;
  op.set_allocated_assign(const_cast<v1::AssignRequest*>(&request));
  op.set_steps_unknown(steps_unknown);
  Broadcast(&op);
  (void)op.release_assign();
  // An assignment is a whole state: one below min_insync is sent again.
  return CheckWritable();
}

absl::StatusOr<v1::RegisterResponse> Replication::Register(
    const v1::RegisterRequest& request) {
  // Not held to min_insync: a registration lost with its primary costs
  // the worker a registration again (its heartbeat's NOT_FOUND), not a
  // weight; and below min_insync reads go on, which need one.
  absl::MutexLock order(&order_mu_);
  RETURN_IF_ERROR(CheckServing());
  ASSIGN_OR_RETURN(v1::RegisterResponse response,
                   membership_->Register(request));
  BroadcastMembership();
  RETURN_IF_ERROR(CheckServing());
  return response;
}

void Replication::MembershipChanged() {
  absl::MutexLock order(&order_mu_);
  if (CheckServing().ok()) BroadcastMembership();
}

void Replication::BroadcastMembership() {
  v1::ReplicaOp op;
  *op.mutable_membership() = membership_->Export();
  Broadcast(&op);
}

absl::Status Replication::CheckTables() const {
  if (tables_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError("this shard serves no embedding tables");
}

absl::Status Replication::DeclareEmbedding(const v1::EmbeddingSpec& spec,
                                           const absl::Status& may_create) {
  RETURN_IF_ERROR(CheckTables());
  absl::MutexLock order(&order_mu_);
  RETURN_IF_ERROR(CheckWritable());
  const bool there = tables_->Find(spec.name()).ok();
  RETURN_IF_ERROR(tables_->Declare(spec, may_create));
  if (!there) {
    v1::ReplicaOp op;
    *op.mutable_declare_embedding()->mutable_spec() = spec;
    Broadcast(&op);
  }
  // A declaration is idempotent: one below min_insync is declared again.
  return CheckWritable();
}

absl::Status Replication::PushRows(const v1::PushRowsRequest& request,
                                   const RowPolicy& policy,
                                   v1::PushRowsResponse* response) {
  RETURN_IF_ERROR(CheckTables());
  absl::MutexLock order(&order_mu_);
  RETURN_IF_ERROR(CheckWritable());
  bool applied = false;
  // The ledger records the answer here, under the order lock, with the
  // effect: a snapshot holds both or neither.
  RETURN_IF_ERROR(ServePushRows(tables_, store_->shard(), num_shards_, request,
                                response, policy, &applied));
  if (applied) {
    v1::ReplicaOp op;
    op.set_allocated_push_rows(const_cast<v1::PushRowsRequest*>(&request));
    op.set_quorum(policy.quorum);
    op.set_now_unix_nanos(absl::ToUnixNanos(policy.now));
    Broadcast(&op);
    (void)op.release_push_rows();  // Back to its owner, the caller.
  }
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
  for (int r : a.stuck) p.add_stuck(r);
  p.set_heal_after_nanos(absl::ToInt64Nanoseconds(a.heal_after));
  return p;
}
}  // namespace

ShardStore::StepsAdvanced Replication::AdvanceSteps(
    const ShardStore::StepAdvance& advance) {
  absl::MutexLock order(&order_mu_);
  if (!CheckServing().ok()) return {};
  ShardStore::StepsAdvanced done = AdvanceShardSteps(store_, tables_, advance);
  if (done.changed()) {
    v1::ReplicaOp op;
    *op.mutable_steps() = ToProto(advance);
    Broadcast(&op);
  }
  return done;
}

absl::StatusOr<uint64_t> Replication::SendSnapshot(Stream* stream,
                                                   int64_t epoch) {
  // Every op of the snapshot carries the op the stream goes on from (a
  // local: the lambda is not seen to run under order_mu_).
  const uint64_t seq = seq_;
  auto send = [&](v1::ReplicaOp* op) -> absl::Status {
    op->set_seq(seq);
    op->set_epoch(epoch);
    const absl::Time deadline =
        absl::Now() + std::max(ack_timeout_, kSnapshotTimeout);
    RETURN_IF_ERROR(WriteOp(stream, op, deadline));
    return ReadAck(stream, seq, deadline);
  };
  // The ledger and the weights are both read under the order lock: the
  // snapshot holds each push's answer with its effect.
  v1::ReplicaOp start;
  v1::ReplicaSnapshot* begin = start.mutable_snapshot();
  begin->set_incarnation(store_->incarnation());
  if (membership_ != nullptr) {
    *begin->mutable_membership() = membership_->Export();
  }
  for (const PushLedger::Remembered& r : ledger_->Export()) {
    v1::LedgerEntry* e = begin->add_ledger();
    e->set_client_id(r.client_id);
    e->set_sequence(r.sequence);
    *e->mutable_answer() = r.answer;
  }
  if (tables_ != nullptr) {
    for (const RowsLedger::Remembered& r : tables_->ledger().Export()) {
      v1::RowsLedgerEntry* e = begin->add_rows_ledger();
      e->set_client_id(r.client_id);
      e->set_sequence(r.sequence);
      *e->mutable_answer() = r.answer;
    }
  }
  RETURN_IF_ERROR(send(&start));
  uint64_t index = 0;
  ChunkEncoder encoder(
      snapshot_chunk_bytes_, [&](std::string bytes, uint32_t crc) {
        v1::ReplicaOp op;
        v1::ReplicaSnapshotChunk* chunk = op.mutable_snapshot_chunk();
        chunk->set_index(index++);
        chunk->set_crc32(crc);
        chunk->set_chunk(std::move(bytes));
        return send(&op);
      });
  const int64_t now = absl::ToUnixMicros(clock_->Now());
  if (store_->declared()) {
    RETURN_IF_ERROR(store_->Snapshot(/*pending=*/true, now, &encoder));
  } else {
    v1::ShardCheckpoint head;  // No model yet: the head alone.
    head.set_shard(store_->shard());
    head.set_unix_micros(now);
    RETURN_IF_ERROR(encoder.Head(head));
  }
  // Each table with its bsp step in progress, one copy at a time.
  for (const EmbeddingTable* table :
       tables_ != nullptr ? tables_->All() : std::vector<EmbeddingTable*>()) {
    v1::EmbeddingCheckpoint saved;
    table->Save(&saved, /*pending=*/true);
    RETURN_IF_ERROR(encoder.Table(&saved));
  }
  RETURN_IF_ERROR(encoder.Finish());
  v1::ReplicaOp end;
  end.mutable_snapshot_end()->set_chunks(encoder.chunks());
  end.mutable_snapshot_end()->set_bytes(encoder.bytes());
  end.mutable_snapshot_end()->set_crc32(encoder.crc());
  RETURN_IF_ERROR(send(&end));
  return encoder.bytes();
}

absl::Status Replication::ServeBackup(Stream* stream,
                                      const v1::ReplicaJoin& join) {
  // Before the order lock: the check may ask the coordinator.
  if (!member_token_.empty() &&
      !ConstantTimeEquals(join.member_token(), member_token_)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard ", store_->shard(), ": ", join.member(),
        " may not join: a join needs the group's member credential "
        "(--member_token_file), which it ",
        join.member_token().empty() ? "did not send" : "does not match"));
  }
  if (const std::string shown = stream->PeerName();
      !member_name_.empty() && shown != member_name_) {
    return absl::PermissionDeniedError(absl::StrCat(
        "shard ", store_->shard(), ": ", join.member(),
        " may not join: a member presents the members' certificate ('",
        member_name_, "'), and it presented ",
        shown.empty() ? "none" : absl::StrCat("'", shown, "'")));
  }
  if (join_check_) RETURN_IF_ERROR(join_check_(join.member()));
  absl::MutexLock order(&order_mu_);
  {
    absl::ReaderMutexLock lock(&mu_);
    if (role_ != Role::kPrimary) {
      return absl::FailedPreconditionError(absl::StrCat(
          "member ", member_, " is not a primary: ", RoleName(role_)));
    }
    if (join.epoch() != epoch_) {
      return absl::FailedPreconditionError(
          absl::StrCat("member ", join.member(), " joins epoch ", join.epoch(),
                       "; this primary's is ", epoch_));
    }
  }
  const absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(const uint64_t bytes, SendSnapshot(stream, join.epoch()));
  backups_.push_back(Backup{stream, join.member()});
  Backup* backup = &backups_.back();
  LOG(INFO) << "shard " << store_->shard() << ": backup " << join.member()
            << " joined at op " << seq_ << " (" << bytes
            << " bytes of state in " << absl::Now() - start << ")";
  NoteBackups();
  order_mu_.Await(absl::Condition(&backup->dropped));
  backups_.remove_if([backup](const Backup& b) { return &b == backup; });
  return absl::UnavailableError(
      absl::StrCat("backup ", join.member(), " left the stream"));
}

}  // namespace asyncps
