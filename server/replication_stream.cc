// The primary's stream to its backups (server/replication.h): each op
// written to every backup under the order lock (Broadcast), its
// acknowledgements read by the thread serving each backup (ReadAcks) and
// waited for without the lock (AwaitAcks), so ops are pipelined; a backup
// that fails is dropped and the group's record of its backups updated
// (NoteBackups) before anything later is acknowledged. A joining backup's
// snapshot and catch-up are in replication_join.cc.
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
    return absl::InvalidArgumentError(absl::StrCat("a backup acknowledged op ",
                                                   ack.seq(), " where ", least,
                                                   " to ", most, " were due"));
  }
  return ack.seq();
}

}  // namespace

absl::Status Replication::WriteOp(Stream* stream, v1::ReplicaOp* op,
                                  absl::Time deadline) {
  FrameHeader header;
  header.op = FrameOp::kReplicate;
  return WriteFrame(stream, header, op, PayloadFields(op), deadline);
}

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
    ASSIGN_OR_RETURN(
        seq, ReadAck(b->stream, least, b->written, absl::Now() + ack_timeout_));
  }
  absl::MutexLock lock(&ack_mu_);
  b->acked = seq;
  return absl::OkStatus();
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

}  // namespace asyncps
