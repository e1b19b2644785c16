// Pipelined replication (issue #40, "Speed"; server/replication.h): a
// change is written to the backups under the order lock and acknowledged
// after it, so concurrent changes do not wait on one another's round trip,
// while nothing is acknowledged before every backup in the stream holds
// it, a retry answered from the ledger waits for its first copy's op, and
// asyncps_replica_lag_ops counts the ops streamed and not yet
// acknowledged.
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"
#include "server/replication.h"
#include "tests/server/replication_pair.h"
#include "tests/server/small_model.h"
#include "transport/socket.h"

namespace asyncps {
namespace {

using testing::Member;
using testing::ReadOp;
using testing::SmallModel;
using testing::SmallModelPush;
using testing::StreamPair;
using testing::WriteAck;

// How long a change that must not be answered yet is given to be (wrongly)
// answered.
constexpr absl::Duration kNotYet = absl::Milliseconds(300);

// Waits (up to 10 s) until the primary's lag is `lag`.
bool LagReaches(Member* primary, int64_t lag) {
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (primary->replication.Stats().lag() != lag && absl::Now() < until) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return primary->replication.Stats().lag() == lag;
}

// A primary of epoch 1 with SmallModel declared and one backup following.
struct Group {
  Group() : primary("p"), backup("b") {
    primary.replication.BecomePrimary(1, absl::InfiniteFuture());
    serve = testing::JoinBackup(&primary, &backup, &streams);
    v1::DeclareModelRequest declare;
    *declare.mutable_spec() = SmallModel();
    EXPECT_TRUE(testing::Streamed(&streams, &backup, [&] {
                  return primary.replication.Declare(declare).status();
                }).ok());
  }
  ~Group() {
    primary.replication.Fence("test over");
    serve.join();
  }
  Member primary, backup;
  StreamPair streams;
  std::thread serve;
};

// A push on its own thread; `done` once Replication::Push answered.
struct PushOnThread {
  PushOnThread(Member* primary, v1::PushRequest request)
      : push(std::move(request)), thread([this, primary] {
          status = primary->replication.Push(push, PushPolicy(), &answer);
          done.Notify();
        }) {}
  ~PushOnThread() { thread.join(); }
  v1::PushRequest push;
  v1::PushResponse answer;
  absl::Status status;
  absl::Notification done;
  std::thread thread;
};

// Fails before pipelining: the second push waited on the order lock until
// the backup acknowledged the first, so the backup never saw its op.
TEST(ReplicationPipeline, ConcurrentPushesDoNotWaitOnOneAnothersAcks) {
  Group g;
  Stream* backup_end = g.streams.b.get();
  auto first = std::make_unique<PushOnThread>(&g.primary, SmallModelPush(1.0f));
  v1::ReplicaOp op1, op2;
  ASSERT_TRUE(ReadOp(backup_end, &op1).ok());
  // Op 1 is on the backup, not acknowledged: the second push still goes.
  auto second =
      std::make_unique<PushOnThread>(&g.primary, SmallModelPush(2.0f));
  ASSERT_TRUE(ReadOp(backup_end, &op2).ok())
      << "the second push waited for the first one's acknowledgement";
  EXPECT_EQ(op2.seq(), op1.seq() + 1);
  EXPECT_TRUE(LagReaches(&g.primary, 2));
  // Both applied on the primary; neither answered before the backup holds
  // it.
  EXPECT_FALSE(first->done.WaitForNotificationWithTimeout(kNotYet));
  EXPECT_FALSE(second->done.HasBeenNotified());
  ASSERT_TRUE(g.backup.replication.Apply(&op1).ok());
  ASSERT_TRUE(g.backup.replication.Apply(&op2).ok());
  ASSERT_TRUE(WriteAck(backup_end, op1.seq()).ok());
  first->done.WaitForNotification();
  EXPECT_TRUE(first->status.ok()) << first->status;
  EXPECT_FALSE(second->done.WaitForNotificationWithTimeout(kNotYet));
  EXPECT_EQ(g.primary.replication.Stats().lag(), 1);
  ASSERT_TRUE(WriteAck(backup_end, op2.seq()).ok());
  second->done.WaitForNotification();
  EXPECT_TRUE(second->status.ok()) << second->status;
  EXPECT_EQ(g.primary.replication.Stats().lag(), 0);
  // 10 - 1 - 2 on both members.
  for (Member* m : {&g.primary, &g.backup}) {
    v1::PullRequest pull;
    *pull.add_slices() = testing::SmallModelKey();
    v1::PullResponse pulled;
    ASSERT_TRUE(m->store.Pull(pull, &pulled).ok());
    std::vector<float> w(4);
    DecodeF32(pulled.slices(0).data(), absl::MakeSpan(w));
    EXPECT_EQ(w, std::vector<float>(4, 7.0f)) << m->replication.member();
  }
}

// A retry answered from the ledger while its first copy's op is on its
// way is answered only once the backup acknowledged it (else a failover
// right after could lose a push the client was told was applied).
TEST(ReplicationPipeline, ARetryAnsweredFromTheLedgerWaitsForTheFirstCopy) {
  Group g;
  v1::PushRequest push = SmallModelPush(1.0f);
  push.set_client_id(42);
  push.set_sequence(1);
  v1::PushResponse ignored;
  ASSERT_EQ(g.primary.ledger.Begin(push, &ignored),
            PushLedger::Verdict::kApply);
  PushOnThread first(&g.primary, push);
  v1::ReplicaOp op;
  ASSERT_TRUE(ReadOp(g.streams.b.get(), &op).ok());
  // The retry: the ledger has the answer (recorded with the effect).
  ASSERT_EQ(g.primary.ledger.Begin(push, &ignored),
            PushLedger::Verdict::kAnswered);
  absl::Notification retried;
  absl::Status retry_status;
  std::thread retry([&] {
    retry_status = g.primary.replication.AwaitStreamed();
    retried.Notify();
  });
  EXPECT_FALSE(retried.WaitForNotificationWithTimeout(kNotYet))
      << "a retry was answered before the backup held its push";
  ASSERT_TRUE(g.backup.replication.Apply(&op).ok());
  ASSERT_TRUE(WriteAck(g.streams.b.get(), op.seq()).ok());
  retry.join();
  EXPECT_TRUE(retry_status.ok()) << retry_status;
  first.done.WaitForNotification();
  EXPECT_TRUE(first.status.ok()) << first.status;
}

// A backup that leaves while ops are in flight: the pushes waiting on it
// are answered once the coordinator's record of the backups leaves it out
// (so it cannot be promoted without them), not before.
TEST(ReplicationPipeline, AChangeWaitsUntilADroppedBackupIsRecordedGone) {
  Group g;
  absl::Notification recording, release;
  std::vector<std::string> recorded = {"b"};
  g.primary.replication.set_backups_changed(
      [&](const std::vector<std::string>& names) {
        recording.Notify();
        release.WaitForNotification();
        recorded = names;
        return absl::OkStatus();
      });
  PushOnThread push(&g.primary, SmallModelPush(1.0f));
  v1::ReplicaOp op;
  ASSERT_TRUE(ReadOp(g.streams.b.get(), &op).ok());
  ShutdownSocket(g.streams.b->fd());  // The backup goes, op unacknowledged.
  recording.WaitForNotification();
  EXPECT_FALSE(push.done.WaitForNotificationWithTimeout(kNotYet))
      << "a push was answered while the record still listed its backup";
  release.Notify();
  push.done.WaitForNotification();
  EXPECT_TRUE(push.status.ok()) << push.status;
  EXPECT_TRUE(recorded.empty());
  EXPECT_EQ(g.primary.replication.Stats().in_sync(), 1);
}

}  // namespace
}  // namespace asyncps
