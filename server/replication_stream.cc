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
// A joining backup that has all but this many ops streamed is brought in
// sync under the order lock (its last ones waited for there).
constexpr uint64_t kJoinSlack = 8;
// How long at a time the order lock is held for those (the workers'
// pause), and how many times, before the last try waits for as long as
// they take.
constexpr absl::Duration kJoinLockedWait = absl::Milliseconds(20);
constexpr int kJoinTries = 100;

// Reads a backup's acknowledgement: the last op it applied, from `least`
// (what it acknowledged before) to `most` (the last op written to it).
absl::StatusOr<uint64_t> ReadAck(Stream* stream, uint64_t least, uint64_t most,
                                 absl::Time deadline) {
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
  if (ack.seq() < least || ack.seq() > most) {
    return absl::InvalidArgumentError(
        absl::StrCat("a backup acknowledged op ", ack.seq(), " where ", least,
                     " to ", most, " were due"));
  }
  return ack.seq();
}

absl::Status WriteOp(Stream* stream, v1::ReplicaOp* op, absl::Time deadline) {
  FrameHeader header;
  header.op = FrameOp::kReplicate;
  return WriteFrame(stream, header, op, PayloadFields(op), deadline);
}

}  // namespace

Replication::Sent Replication::Broadcast(v1::ReplicaOp* op) {
  ++seq_;
  std::vector<std::shared_ptr<Backup>> joining;
  const Sent sent = Streamed(&joining);  // The new op, to the backups.
  op->set_seq(sent.seq);
  {
    absl::ReaderMutexLock lock(&mu_);
    op->set_epoch(epoch_);
  }
  const size_t op_bytes = op->ByteSizeLong();
  // A joining backup whose snapshot is still going out gets a copy queued
  // (its serving thread writes it between chunks), so no change waits
  // for a snapshot; the others get the op now, every one before any
  // acknowledgement is waited for, so they apply it side by side.
  std::vector<std::shared_ptr<Backup>> now = sent.to;
  for (const std::shared_ptr<Backup>& b : joining) {
    absl::MutexLock queue(&b->queue_mu);
    if (!b->sending) {
      now.push_back(b);
    } else if (b->queued_bytes + op_bytes > join_backlog_bytes_) {
      absl::MutexLock lock(&ack_mu_);
      Drop(b.get(), absl::ResourceExhaustedError(absl::StrCat(
                        "its backlog of ops passed ", join_backlog_bytes_,
                        " bytes while its snapshot went out")));
    } else {
      b->queued_bytes += op_bytes;
      b->queue.push_back(*op);
    }
  }
  int64_t bytes = 0;
  for (const std::shared_ptr<Backup>& b : now) {
    absl::Status s;
    {
      absl::MutexLock io(&b->io_mu);
      b->written = sent.seq;
      s = WriteOp(b->stream, op, sent.deadline);
    }
    if (!s.ok()) {
      absl::MutexLock lock(&ack_mu_);
      Drop(b.get(), s);
    } else {
      bytes += static_cast<int64_t>(op_bytes);
    }
  }
  absl::MutexLock lock(&mu_);
  applied_ = seq_;
  bytes_ += bytes;
  return sent;
}

Replication::Sent Replication::Streamed(
    std::vector<std::shared_ptr<Backup>>* joining) {
  Sent sent;
  sent.seq = seq_;
  sent.deadline = absl::Now() + ack_timeout_;
  absl::MutexLock lock(&ack_mu_);
  for (const std::shared_ptr<Backup>& b : backups_) {
    if (b->dropped) continue;
    if (b->in_sync) {
      sent.to.push_back(b);
    } else if (joining != nullptr) {
      joining->push_back(b);
    }
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
  b->dropped_why = why;
  // One not yet in sync was never recorded as in sync: nothing waits for
  // its drop to be.
  if (b->in_sync) {
    ++unnoted_drops_;
  } else {
    b->noted = true;
  }
  ShutdownSocket(b->stream->fd());
}

absl::Status Replication::ReadAcks(Backup* b) {
  for (;;) RETURN_IF_ERROR(ReadNextAck(b, absl::InfiniteFuture()));
}

absl::Status Replication::ReadNextAck(Backup* b, absl::Time deadline) {
  bool buffered;
  {
    absl::MutexLock io(&b->io_mu);
    buffered = b->stream->Buffered();
  }
  // Waits without the stream's lock, so ops go out meanwhile; a drop
  // shuts the socket, which wakes it.
  if (!buffered) RETURN_IF_ERROR(WaitReadable(b->stream->fd(), deadline));
  uint64_t least;
  {
    absl::MutexLock lock(&ack_mu_);
    if (b->dropped) return absl::UnavailableError("dropped from the stream");
    least = b->acked;
  }
  uint64_t seq;
  {
    absl::MutexLock io(&b->io_mu);
    ASSIGN_OR_RETURN(seq, ReadAck(b->stream, least, b->written,
                                  absl::Now() + ack_timeout_));
  }
  absl::MutexLock lock(&ack_mu_);
  b->acked = seq;
  return absl::OkStatus();
}

absl::Status Replication::FlushQueue(Backup* b, bool last) {
  std::deque<v1::ReplicaOp> ops;
  auto write = [&] {
    absl::MutexLock io(&b->io_mu);
    for (v1::ReplicaOp& op : ops) {
      b->written = op.seq();
      RETURN_IF_ERROR(WriteOp(b->stream, &op, absl::Now() + ack_timeout_));
    }
    return absl::OkStatus();
  };
  if (!last) {
    {
      absl::MutexLock queue(&b->queue_mu);
      ops.swap(b->queue);
      b->queued_bytes = 0;
    }
    return write();
  }
  // The queue's lock is held until its last ops are written, so that
  // Broadcast's own writes, from now on, come after them.
  absl::MutexLock queue(&b->queue_mu);
  ops.swap(b->queue);
  b->queued_bytes = 0;
  b->sending = false;
  return write();
}

absl::Status Replication::CatchUp(Backup* b, std::string* how) {
  // The first acknowledgement comes once the snapshot is in place and the
  // ops that came meanwhile applied; then one per op, as they come.
  RETURN_IF_ERROR(ReadNextAck(
      b, absl::Now() + std::max(ack_timeout_, kSnapshotTimeout)));
  for (int tries = 1;; ++tries) {
    // Without the lock while it is more than a few ops behind; after a try
    // under the lock that timed out, for one more acknowledgement at
    // least, so that the workers' pushes get the lock in between.
    for (bool again = tries > 1;; again = false) {
      if (!again) {
        absl::MutexLock lock(&ack_mu_);
        if (b->written <= b->acked + kJoinSlack) break;
      }
      RETURN_IF_ERROR(ReadNextAck(b, absl::Now() + ack_timeout_));
    }
    // Then under the order lock, so that no op goes out meanwhile, the
    // last ones: the backup then holds every op streamed, and is recorded
    // so before anything later is acknowledged. The workers wait for that,
    // so at most kJoinLockedWait at a time: a backup still busy applying
    // gets the lock let go and another try (the last try waits as long as
    // an op may take).
    absl::MutexLock order(&order_mu_);
    const absl::Time locked = absl::Now();
    const absl::Time until =
        locked + (tries < kJoinTries ? kJoinLockedWait : ack_timeout_);
    for (;;) {
      bool in_sync = false;
      {
        absl::MutexLock lock(&ack_mu_);
        if (b->dropped) return absl::UnavailableError("dropped from the stream");
        if (b->acked == seq_) b->in_sync = in_sync = true;
      }
      if (in_sync) {
        NoteBackups();
        *how = absl::StrCat("caught up in ", tries, " tries, the last ops "
                            "and its record taking ", absl::FormatDuration(
                                absl::Now() - locked), " under the lock");
        return absl::OkStatus();
      }
      absl::Status s = ReadNextAck(b, until);
      if (absl::IsDeadlineExceeded(s) && tries < kJoinTries) break;
      RETURN_IF_ERROR(s);
    }
  }
}

void Replication::NoteBackups() {
  std::vector<std::string> names;
  {
    absl::MutexLock lock(&ack_mu_);
    for (const std::shared_ptr<Backup>& b : backups_) {
      if (!b->dropped && b->in_sync) names.push_back(b->member);
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

absl::StatusOr<uint64_t> Replication::SendSnapshot(Backup* b,
                                                   StateCopy* copy,
                                                   int64_t epoch) {
  const uint64_t seq = b->written;  // The op it was copied at.
  auto send = [&](v1::ReplicaOp* op) -> absl::Status {
    op->set_seq(seq);
    op->set_epoch(epoch);
    RETURN_IF_ERROR(FlushQueue(b, /*last=*/false));
    absl::MutexLock io(&b->io_mu);
    return WriteOp(b->stream, op,
                   absl::Now() + std::max(ack_timeout_, kSnapshotTimeout));
  };
  ASSIGN_OR_RETURN(const uint64_t bytes, EncodeState(copy, send));
  RETURN_IF_ERROR(FlushQueue(b, /*last=*/true));
  return bytes;
}

absl::StatusOr<std::vector<v1::ReplicaOp>> Replication::SnapshotOps() {
  StateCopy copy;
  int64_t epoch;
  uint64_t seq;
  {
    absl::MutexLock order(&order_mu_);
    RETURN_IF_ERROR(CopyState(&copy));
    absl::ReaderMutexLock lock(&mu_);
    epoch = epoch_;
    seq = applied_;
  }
  std::vector<v1::ReplicaOp> ops;
  RETURN_IF_ERROR(EncodeState(&copy, [&](v1::ReplicaOp* op) {
                    op->set_seq(seq);
                    op->set_epoch(epoch);
                    ops.push_back(*op);
                    return absl::OkStatus();
                  }).status());
  return ops;
}

absl::Status Replication::CopyState(StateCopy* copy) {
  // Under the order lock the ledger and the weights are read together:
  // the snapshot holds each push's answer with its effect.
  copy->start.Clear();
  v1::ReplicaSnapshot* begin = copy->start.mutable_snapshot();
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
  const int64_t now = absl::ToUnixMicros(clock_->Now());
  copy->declared = store_->declared();
  if (copy->declared) {
    RETURN_IF_ERROR(
        store_->SnapshotInto(/*pending=*/true, now, &copy->head, &copy->slices));
  } else {
    copy->head.Clear();  // No model yet: the head alone.
    copy->head.set_shard(store_->shard());
    copy->head.set_unix_micros(now);
    copy->slices.clear();
  }
  // Each table with its bsp step in progress, one copy at a time.
  const std::vector<EmbeddingTable*> tables =
      tables_ != nullptr ? tables_->All() : std::vector<EmbeddingTable*>();
  copy->tables.resize(tables.size());
  for (size_t i = 0; i < tables.size(); ++i) {
    copy->tables[i].Clear();
    tables[i]->Save(&copy->tables[i], /*pending=*/true);
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> Replication::EncodeState(
    StateCopy* copy, const std::function<absl::Status(v1::ReplicaOp*)>& send) {
  RETURN_IF_ERROR(send(&copy->start));
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
  RETURN_IF_ERROR(encoder.Head(copy->head));
  for (v1::SliceCheckpoint& slice : copy->slices) {
    RETURN_IF_ERROR(encoder.Slice(&slice));
  }
  for (v1::EmbeddingCheckpoint& table : copy->tables) {
    RETURN_IF_ERROR(encoder.Table(&table));
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
  // A first copy without the lock sizes the buffers (on a big shard,
  // faulting fresh memory in costs far more than copying into it).
  auto copy = std::make_unique<StateCopy>();
  RETURN_IF_ERROR(CopyState(copy.get()));
  std::shared_ptr<Backup> backup;
  const absl::Time start = absl::Now();
  absl::Duration paused;
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
    const absl::Time locked = absl::Now();
    RETURN_IF_ERROR(CopyState(copy.get()));
    backup = std::make_shared<Backup>(stream, join.member(), seq_);
    absl::MutexLock lock(&ack_mu_);
    backups_.push_back(backup);
    paused = absl::Now() - locked;
  }
  absl::StatusOr<uint64_t> bytes = SendSnapshot(backup.get(), copy.get(),
                                                join.epoch());
  copy.reset();
  absl::Status why = bytes.status();
  std::string how;
  if (why.ok()) why = CatchUp(backup.get(), &how);
  if (why.ok()) {
    LOG(INFO) << "shard " << store_->shard() << ": backup " << join.member()
              << " in sync at op " << backup->written << " (" << *bytes
              << " bytes of state; changes paused " << paused
              << " for its copy; " << absl::Now() - start << " in all; "
              << how << ")";
    why = ReadAcks(backup.get());
  }
  absl::MutexLock order(&order_mu_);
  {
    absl::MutexLock lock(&ack_mu_);
    // Dropped by another thread: its reason, not the broken stream's.
    if (backup->dropped) why = backup->dropped_why;
    Drop(backup.get(), why);
    backups_.erase(std::find(backups_.begin(), backups_.end(), backup));
  }
  NoteBackups();
  absl::MutexLock lock(&ack_mu_);
  if (!backup->noted) {
    backup->noted = true;
    --unnoted_drops_;
  }
  return absl::UnavailableError(absl::StrCat(
      "backup ", join.member(), " left the stream: ", why.message()));
}

}  // namespace asyncps
