// A backup joining a primary that keeps serving (issue #40, "A backup joins
// without stopping training"): the primary copies its state under the
// order lock and sends the copy without it, so pushes go on while the
// backup reads the snapshot; the ops that came meanwhile follow it, and
// the backup, once through both, holds exactly the primary's state and is
// in sync.
#include <sys/socket.h>

#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "server/replication.h"
#include "tests/server/replication_pair.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

using testing::ChunkyModel;
using testing::ChunkyModelPush;
using testing::FollowOne;
using testing::FollowSnapshot;
using testing::Member;
using testing::StreamPair;

std::string State(Member* m) {
  return m->store.Snapshot(/*pending=*/true)->SerializeAsString();
}

// Declares ChunkyModel (36 KiB of state with Adam's slots) on `primary`,
// in 1 KiB snapshot chunks, and pushes once.
void Start(Member* primary) {
  primary->replication.set_snapshot_chunk_bytes(1024);
  primary->replication.BecomePrimary(1, absl::InfiniteFuture());
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = ChunkyModel();
  ASSERT_TRUE(primary->replication.Declare(declare).ok());
  v1::PushResponse answer;
  ASSERT_TRUE(
      primary->replication.Push(ChunkyModelPush(1.0f), PushPolicy(), &answer)
          .ok());
}

// The smallest socket buffers the kernel allows between the two: the
// primary cannot write the whole snapshot ahead of a backup that stops
// reading.
void Narrow(StreamPair* streams) {
  const int bytes = 1;
  for (int fd : {streams->a->fd(), streams->b->fd()}) {
    ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes)), 0);
    ASSERT_EQ(setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes)), 0);
  }
}

// A push with a ledger identity, as Consistency::Push makes it.
void LedgerPush(Member* primary, const v1::PushRequest& push) {
  v1::PushResponse answer;
  ASSERT_EQ(primary->ledger.Begin(push, &answer), PushLedger::Verdict::kApply);
  absl::Status s = primary->replication.Push(push, PushPolicy(), &answer);
  EXPECT_TRUE(s.ok()) << s;
  primary->ledger.Finish(push, s, answer);
}

TEST(ReplicationJoin, PushesGoOnWhileABackupReadsTheSnapshot) {
  Member primary("p"), backup("b");
  Start(&primary);
  StreamPair streams;
  Narrow(&streams);
  std::thread serve = testing::ServeJoin(&primary, &backup, &streams);
  // The backup takes the snapshot's start and one chunk, then reads no more
  // for a while (a slow link, a busy machine).
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(FollowOne(streams.b.get(), &backup.replication).ok());
  }
  // Pushes are acknowledged meanwhile: a joining backup is not in sync,
  // and the primary does not wait for its snapshot to go through.
  v1::PushRequest push = ChunkyModelPush(-0.5f);
  push.set_client_id(42);
  push.set_sequence(1);
  absl::Notification pushed;
  std::thread training([&] {
    LedgerPush(&primary, push);
    LedgerPush(&primary, ChunkyModelPush(0.75f));
    pushed.Notify();
  });
  EXPECT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(10)))
      << "pushes waited for a joining backup's snapshot";
  EXPECT_EQ(primary.replication.Stats().backups_size(), 0);
  // The backup reads on: the rest of the snapshot, then the pushes that
  // came meanwhile, and is in sync with exactly the primary's state.
  ASSERT_TRUE(FollowSnapshot(streams.b.get(), &backup.replication).ok());
  training.join();
  // The pushes came between chunks (the narrow buffers held the rest of
  // the snapshot back), so the backup applied them right after its end.
  EXPECT_EQ(backup.replication.Stats().applied_seq(),
            primary.replication.Stats().applied_seq());
  ASSERT_TRUE(testing::WaitInSync(&primary, 1));
  EXPECT_EQ(State(&backup), State(&primary));
  v1::PushResponse retried;  // The push that came while it joined.
  EXPECT_EQ(backup.ledger.Begin(push, &retried),
            PushLedger::Verdict::kAnswered);
  // In sync: the next push streams to it as to any backup.
  ASSERT_TRUE(testing::Streamed(&streams, &backup, [&] {
                v1::PushResponse a;
                return primary.replication.Push(ChunkyModelPush(0.25f),
                                                PushPolicy(), &a);
              }).ok());
  EXPECT_EQ(State(&backup), State(&primary));
  primary.replication.Fence("test over");
  serve.join();
}

// What a joining backup has yet to receive is bounded: past
// set_join_backlog_bytes the primary drops it (it joins again) and goes on.
TEST(ReplicationJoin, AJoinerFallingTooFarBehindIsDropped) {
  Member primary("p"), backup("b");
  Start(&primary);
  primary.replication.set_join_backlog_bytes(1);
  StreamPair streams;
  Narrow(&streams);
  v1::ReplicaJoin join;
  join.set_epoch(1);
  join.set_member("b");
  absl::Status ended;
  std::thread serve(
      [&] { ended = primary.replication.ServeBackup(streams.a.get(), join); });
  backup.replication.BecomeBackup(1, "p");
  ASSERT_TRUE(FollowOne(streams.b.get(), &backup.replication).ok());
  LedgerPush(&primary, ChunkyModelPush(-0.5f));
  serve.join();
  EXPECT_FALSE(ended.ok());
  EXPECT_NE(ended.message().find("backlog"), absl::string_view::npos) << ended;
  EXPECT_EQ(primary.replication.Stats().backups_size(), 0);
  LedgerPush(&primary, ChunkyModelPush(0.25f));  // The primary goes on.
}

}  // namespace
}  // namespace asyncps
