#include "tests/server/replication_pair.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>

#include "common/clock.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "transport/frame.h"

namespace asyncps::testing {

Member::Member(const std::string& name, PushPolicy policy)
    : store(0, 1, uint64_t{64} << 20),
      membership(Clock::Real(), absl::Seconds(10)),
      replication(&store, &ledger, Clock::Real(), name, policy,
                  absl::Seconds(10)) {
  replication.set_tables(&tables, /*num_shards=*/1);
  replication.set_membership(&membership);
}

StreamPair::StreamPair() {
  int fds[2];
  EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  for (int fd : fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  a = std::make_unique<TcpStream>(fds[0]);
  b = std::make_unique<TcpStream>(fds[1]);
}

StreamPair::~StreamPair() {
  close(a->fd());
  close(b->fd());
}

std::thread ServeJoin(Member* primary, Member* backup, StreamPair* streams) {
  v1::ReplicaJoin join;
  join.set_epoch(1);
  join.set_member(backup->replication.member());
  std::thread serve([primary, streams, join] {
    EXPECT_FALSE(primary->replication.ServeBackup(streams->a.get(), join).ok());
  });
  backup->replication.BecomeBackup(1, primary->replication.member());
  return serve;
}

std::thread JoinBackup(Member* primary, Member* backup, StreamPair* streams) {
  const int backups = primary->replication.Stats().backups_size();
  std::thread serve = ServeJoin(primary, backup, streams);
  EXPECT_TRUE(FollowSnapshot(streams->b.get(), &backup->replication).ok());
  EXPECT_TRUE(WaitInSync(primary, backups + 1));
  return serve;
}

bool WaitInSync(Member* primary, int backups) {
  // The primary's serving thread counts the backup in once it read the
  // snapshot's acknowledgement: moments after the backup sent it.
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (primary->replication.Stats().backups_size() != backups) {
    if (absl::Now() > until) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

absl::Status ReadOp(Stream* stream, v1::ReplicaOp* op) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSIGN_OR_RETURN(FrameHeader header,
                   ReadHeader(stream, uint64_t{64} << 20, deadline));
  return ReadBody(
      stream, header, op, [&] { return PayloadFields(op); }, deadline);
}

absl::Status WriteAck(Stream* stream, uint64_t seq) {
  v1::ReplicaAck ack;
  ack.set_seq(seq);
  FrameHeader answer;
  answer.op = FrameOp::kAnswer;
  return WriteFrame(stream, answer, &ack, {}, absl::Now() + absl::Seconds(10));
}

absl::Status FollowOne(Stream* stream, Replication* backup) {
  v1::ReplicaOp op;
  RETURN_IF_ERROR(ReadOp(stream, &op));
  std::optional<uint64_t> applied;
  RETURN_IF_ERROR(backup->Apply(&op, &applied));
  return applied.has_value() ? WriteAck(stream, *applied) : absl::OkStatus();
}

absl::Status FollowSnapshot(Stream* stream, Replication* backup, int* ops) {
  int n = 0;
  while (backup->role() == Replication::Role::kJoining) {
    RETURN_IF_ERROR(FollowOne(stream, backup));
    ++n;
  }
  if (ops != nullptr) *ops = n;
  return absl::OkStatus();
}

}  // namespace asyncps::testing
