// A backup joining the primary (server/replication.h): ServeBackup takes
// the shard's state at one op under the order lock (CopyState: the
// ledgers and the tables copied there, the slices copied on write,
// into buffers sized by a first copy without the lock), sends it as the
// snapshot without the lock (SendSnapshot, EncodeState, which finishes
// the slices' copy first) with the ops of that time queued between
// chunks (FlushQueue), then waits until the backup has them all
// (CatchUp) and counts it in sync. SnapshotOps is the same copy for a
// primary fenced for its lease, kept in memory.
#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint_stream.h"
#include "server/replication.h"

namespace asyncps {
namespace {
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

}  // namespace

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
  RETURN_IF_ERROR(
      ReadNextAck(b, absl::Now() + std::max(ack_timeout_, kSnapshotTimeout)));
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
        if (b->dropped)
          return absl::UnavailableError("dropped from the stream");
        if (b->acked == seq_) b->in_sync = in_sync = true;
      }
      if (in_sync) {
        NoteBackups();
        *how = absl::StrCat("caught up in ", tries,
                            " tries, the last ops "
                            "and its record taking ",
                            absl::FormatDuration(absl::Now() - locked),
                            " under the lock");
        return absl::OkStatus();
      }
      absl::Status s = ReadNextAck(b, until);
      if (absl::IsDeadlineExceeded(s) && tries < kJoinTries) break;
      RETURN_IF_ERROR(s);
    }
  }
}
absl::StatusOr<uint64_t> Replication::SendSnapshot(Backup* b, StateCopy* copy,
                                                   int64_t epoch) {
  const uint64_t seq = b->written;  // The op it was copied at.
  auto send = [&](v1::ReplicaOp* op) -> absl::Status {
    op->set_seq(seq);
    op->set_epoch(epoch);
    // The ops queued meanwhile go between chunks, never before the start:
    // a backup takes no op before the snapshot began. (This thread is the
    // only writer while the snapshot goes out, so the start is first.)
    if (op->op_case() != v1::ReplicaOp::kSnapshot) {
      RETURN_IF_ERROR(FlushQueue(b, /*last=*/false));
    }
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
  copy->lazy.reset();  // An earlier copy into these buffers is finished.
  copy->declared = store_->declared();
  if (copy->declared) {
    ASSIGN_OR_RETURN(copy->lazy,
                     store_->SnapshotLazily(/*pending=*/true, now, &copy->head,
                                            &copy->slices));
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
  copy->lazy.reset();  // Finishes the slices' copy (no order lock here).
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
  copy->lazy.reset();  // Copied now, without the lock.
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
  absl::StatusOr<uint64_t> bytes =
      SendSnapshot(backup.get(), copy.get(), join.epoch());
  copy.reset();
  absl::Status why = bytes.status();
  std::string how;
  if (why.ok()) why = CatchUp(backup.get(), &how);
  if (why.ok()) {
    LOG(INFO) << "shard " << store_->shard() << ": backup " << join.member()
              << " in sync at op " << backup->written << " (" << *bytes
              << " bytes of state; changes paused " << paused
              << " for its copy; " << absl::Now() - start << " in all; " << how
              << ")";
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
