// The primary's stream to its backups (server/replication.h): each op
// written to every backup under the order lock (Broadcast), its
// acknowledgements read by the thread serving each backup (ReadAcks) and
// waited for without the lock (AwaitAcks), so ops are pipelined; a backup
// that fails is dropped and the group's record of its backups updated
// (NoteBackups) before anything later is acknowledged; and a joining
// backup's snapshot (SendSnapshot, ServeBackup).
#include <algorithm>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint_stream.h"
#include "server/replication.h"
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

Replication::Sent Replication::Broadcast(v1::ReplicaOp* op) {
  ++seq_;
  const Sent sent = Streamed();  // The new op, to the backups in the stream.
  op->set_seq(sent.seq);
  {
    absl::ReaderMutexLock lock(&mu_);
    op->set_epoch(epoch_);
  }
  // Every backup gets the op before any acknowledgement is waited for, so
  // they apply it side by side.
  int64_t bytes = 0;
  for (const std::shared_ptr<Backup>& b : sent.to) {
    absl::Status s;
    {
      absl::MutexLock io(&b->io_mu);
      s = WriteOp(b->stream, op, sent.deadline);
    }
    if (!s.ok()) {
      absl::MutexLock lock(&ack_mu_);
      Drop(b.get(), s);
    } else {
      bytes += static_cast<int64_t>(op->ByteSizeLong());
    }
  }
  absl::MutexLock lock(&mu_);
  applied_ = seq_;
  bytes_ += bytes;
  return sent;
}

Replication::Sent Replication::Streamed() {
  Sent sent;
  sent.seq = seq_;
  sent.deadline = absl::Now() + ack_timeout_;
  absl::MutexLock lock(&ack_mu_);
  for (const std::shared_ptr<Backup>& b : backups_) {
    if (!b->dropped) sent.to.push_back(b);
  }
  return sent;
}

void Replication::AwaitAcks(const Sent& sent) {
  auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(ack_mu_) {
    if (unnoted_drops_ > 0) return false;
    for (const std::shared_ptr<Backup>& b : sent.to) {
      if (!b->noted && b->acked < sent.seq) return false;
    }
    return true;
  };
  absl::MutexLock lock(&ack_mu_);
  if (ack_mu_.AwaitWithDeadline(absl::Condition(&done), sent.deadline)) return;
  for (const std::shared_ptr<Backup>& b : sent.to) {
    if (b->acked < sent.seq) {
      Drop(b.get(), absl::DeadlineExceededError(absl::StrCat(
                        "op ", sent.seq, " not acknowledged within ",
                        absl::FormatDuration(ack_timeout_))));
    }
  }
  // Their serving threads record the backups without them.
  ack_mu_.Await(absl::Condition(&done));
}

absl::Status Replication::AwaitStreamed() {
  Sent sent;
  {
    absl::MutexLock order(&order_mu_);
    sent = Streamed();
  }
  AwaitAcks(sent);
  return CheckServing();
}

void Replication::Drop(Backup* b, const absl::Status& why) {
  if (b->dropped) return;
  LOG(WARNING) << "shard " << store_->shard() << ": dropping backup "
               << b->member << " (acknowledged op " << b->acked << "): " << why;
  b->dropped = true;
  ++unnoted_drops_;
  ShutdownSocket(b->stream->fd());
}

absl::Status Replication::ReadAcks(Backup* b) {
  for (;;) {
    bool buffered;
    {
      absl::MutexLock io(&b->io_mu);
      buffered = b->stream->Buffered();
    }
    // Waits without the stream's lock, so ops go out meanwhile; a drop
    // shuts the socket, which wakes it.
    if (!buffered) {
      RETURN_IF_ERROR(WaitReadable(b->stream->fd(), absl::InfiniteFuture()));
    }
    uint64_t due;
    {
      absl::MutexLock lock(&ack_mu_);
      if (b->dropped) return absl::UnavailableError("dropped from the stream");
      due = b->acked + 1;
    }
    {
      absl::MutexLock io(&b->io_mu);
      RETURN_IF_ERROR(ReadAck(b->stream, due, absl::Now() + ack_timeout_));
    }
    absl::MutexLock lock(&ack_mu_);
    b->acked = due;
  }
}

void Replication::NoteBackups() {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&ack_mu_);
    for (const std::shared_ptr<Backup>& b : backups_) {
      if (!b->dropped) names.push_back(b->member);
    }
  }
  {
    absl::MutexLock lock(&mu_);
    backup_names_ = names;
    // A fenced member writes nothing more to the coordinator.
    if (role_ == Role::kFenced) return;
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
  return WriteSnapshot(send);
}

absl::StatusOr<std::vector<v1::ReplicaOp>> Replication::SnapshotOps() {
  absl::MutexLock order(&order_mu_);
  int64_t epoch;
  uint64_t seq;
  {
    absl::ReaderMutexLock lock(&mu_);
    epoch = epoch_;
    seq = applied_;
  }
  std::vector<v1::ReplicaOp> ops;
  RETURN_IF_ERROR(WriteSnapshot([&](v1::ReplicaOp* op) {
                    op->set_seq(seq);
                    op->set_epoch(epoch);
                    ops.push_back(*op);
                    return absl::OkStatus();
                  }).status());
  return ops;
}

absl::StatusOr<uint64_t> Replication::WriteSnapshot(
    const std::function<absl::Status(v1::ReplicaOp*)>& send) {
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
  std::shared_ptr<Backup> backup;
  {
    absl::MutexLock order(&order_mu_);
    {
      absl::ReaderMutexLock lock(&mu_);
      if (role_ != Role::kPrimary) {
        return absl::FailedPreconditionError(absl::StrCat(
            "member ", member_, " is not a primary: ", RoleName(role_)));
      }
      if (join.epoch() != epoch_) {
        return absl::FailedPreconditionError(
            absl::StrCat("member ", join.member(), " joins epoch ",
                         join.epoch(), "; this primary's is ", epoch_));
      }
    }
    const absl::Time start = absl::Now();
    ASSIGN_OR_RETURN(const uint64_t bytes, SendSnapshot(stream, join.epoch()));
    backup = std::make_shared<Backup>(stream, join.member(), seq_);
    {
      absl::MutexLock lock(&ack_mu_);
      backups_.push_back(backup);
    }
    LOG(INFO) << "shard " << store_->shard() << ": backup " << join.member()
              << " joined at op " << seq_ << " (" << bytes
              << " bytes of state in " << absl::Now() - start << ")";
    NoteBackups();
  }
  const absl::Status why = ReadAcks(backup.get());
  absl::MutexLock order(&order_mu_);
  {
    absl::MutexLock lock(&ack_mu_);
    Drop(backup.get(), why);
    backups_.erase(std::find(backups_.begin(), backups_.end(), backup));
  }
  NoteBackups();
  absl::MutexLock lock(&ack_mu_);
  backup->noted = true;
  --unnoted_drops_;
  return absl::UnavailableError(absl::StrCat(
      "backup ", join.member(), " left the stream: ", why.message()));
}

}  // namespace asyncps
