// Replication (server/replication.h) between two members in one process,
// over a socket pair: the snapshot a joining backup starts from holds each
// push's answer with its effect, so exactly-once survives a promotion.
#include "server/replication.h"

#include <sys/socket.h>

#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "server/checkpoint_stream.h"
#include "server/replica_snapshot.h"
#include "tests/server/replication_pair.h"
#include "tests/server/small_model.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps {
namespace {

using testing::FollowOne;
using testing::FollowSnapshot;
using testing::Member;
using testing::SmallModel;
using testing::SmallModelPush;
using testing::StreamPair;

std::vector<float> Weights(ShardStore* store) {
  v1::PullRequest pull;
  *pull.add_slices() = testing::SmallModelKey();
  v1::PullResponse response;
  EXPECT_TRUE(store->Pull(pull, &response).ok());
  std::vector<float> w(4);
  DecodeF32(response.slices(0).data(), absl::MakeSpan(w));
  return w;
}

// Regression (issue #38, 6): the snapshot held only the pushes whose
// answer the ledger had recorded, while a push applied under the order
// lock but not yet recorded (Consistency::Push records it after
// Replication::Push returns) was in the snapshot's weights. A backup that
// joined in that gap and was promoted applied the client's retry a second
// time. This drives exactly that gap: the push is applied by the primary,
// the backup joins before Consistency would record the answer, and a retry
// on the backup must be answered, not applied.
TEST(Replication, ABackupJoiningBeforeAnAnswerIsRecordedKnowsThePush) {
  Member primary("p"), backup("b");
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  ASSERT_TRUE(primary.replication
                  .Declare([] {
                    v1::DeclareModelRequest r;
                    *r.mutable_spec() = SmallModel();
                    return r;
                  }())
                  .ok());

  v1::PushRequest push = SmallModelPush(3.0f);
  push.set_client_id(42);
  push.set_sequence(7);
  v1::PushResponse answer;
  ASSERT_EQ(primary.ledger.Begin(push, &answer), PushLedger::Verdict::kApply);
  ASSERT_TRUE(primary.replication.Push(push, PushPolicy(), &answer).ok());
  // Consistency::Push would record the answer now (ledger.Finish); the
  // backup joins first.

  StreamPair streams;
  v1::ReplicaJoin join;
  join.set_epoch(1);
  join.set_member("b");
  std::thread serve([&] {
    absl::Status s = primary.replication.ServeBackup(streams.a.get(), join);
    EXPECT_FALSE(s.ok());  // It ends when the primary is fenced below.
  });
  backup.replication.BecomeBackup(1, "p");
  ASSERT_TRUE(FollowSnapshot(streams.b.get(), &backup.replication).ok());
  primary.ledger.Finish(push, absl::OkStatus(), answer);

  // The backup holds the push's effect...
  EXPECT_EQ(Weights(&backup.store), std::vector<float>(4, 7.0f));
  // ...and, promoted, answers the client's retry instead of applying it.
  v1::PushResponse retried;
  EXPECT_EQ(backup.ledger.Begin(push, &retried), PushLedger::Verdict::kAnswered)
      << "a retry of push 7 would be applied a second time";
  EXPECT_EQ(retried.versions_size(), answer.versions_size());

  primary.replication.Fence("test over");
  serve.join();
}

// A snapshot in 1 KiB chunks: many ops, each slice cut over several, and the
// backup ends with exactly the primary's state, then follows its stream.
TEST(Replication, ASnapshotInManySmallChunksIsThePrimarysWholeState) {
  Member primary("p"), backup("b");
  primary.replication.set_snapshot_chunk_bytes(1024);
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = testing::ChunkyModel();
  ASSERT_TRUE(primary.replication.Declare(declare).ok());
  v1::PushResponse answer;
  for (float g : {1.0f, -0.5f}) {
    ASSERT_TRUE(primary.replication
                    .Push(testing::ChunkyModelPush(g), PushPolicy(), &answer)
                    .ok());
  }

  StreamPair streams;
  std::thread serve = testing::ServeJoin(&primary, &backup, &streams);
  int ops = 0;
  ASSERT_TRUE(FollowSnapshot(streams.b.get(), &backup.replication, &ops).ok());
  EXPECT_GT(ops, 30);  // A start, 36 KiB in 1 KiB chunks, an end.
  EXPECT_EQ(backup.store.Snapshot(true)->SerializeAsString(),
            primary.store.Snapshot(true)->SerializeAsString());

  // The stream goes on from the snapshot.
  std::thread push([&] {
    v1::PushResponse r;
    EXPECT_TRUE(primary.replication
                    .Push(testing::ChunkyModelPush(0.25f), PushPolicy(), &r)
                    .ok());
  });
  ASSERT_TRUE(FollowOne(streams.b.get(), &backup.replication).ok());
  push.join();
  EXPECT_EQ(backup.store.Snapshot(true)->SerializeAsString(),
            primary.store.Snapshot(true)->SerializeAsString());

  primary.replication.Fence("test over");
  serve.join();
}

// Issue #40, "A minimum in sync": with min_insync 2, a primary alone
// refuses a change before applying it; one whose only backup drops out
// while a push streams keeps the push (applied once, its answer
// remembered, so a retry is answered, not applied again) but is not
// writable: Consistency::Push does not acknowledge it until a backup that
// joins holds it.
TEST(Replication, BelowMinInsyncNothingOnlyThePrimaryHoldsIsAcknowledged) {
  Member primary("p"), backup("b"), later("c");
  primary.replication.set_min_insync(2);
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = SmallModel();
  absl::Status alone = primary.replication.Declare(declare).status();
  EXPECT_EQ(alone.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(alone.message().find("fewer than --min_insync=2"),
            absl::string_view::npos)
      << alone;
  EXPECT_FALSE(primary.store.declared());
  EXPECT_EQ(primary.replication.Stats().in_sync(), 1);
  // Serves `member` on `streams` until it drops; true once it is in.
  auto join = [&](StreamPair* streams, Member* m, std::thread* serve) {
    v1::ReplicaJoin j;
    j.set_epoch(1);
    j.set_member(m->replication.member());
    *serve = std::thread([&primary, streams, j] {
      EXPECT_FALSE(primary.replication.ServeBackup(streams->a.get(), j).ok());
    });
    m->replication.BecomeBackup(1, "p");
    EXPECT_TRUE(FollowSnapshot(streams->b.get(), &m->replication).ok());
    // ServeBackup lists the backup once the snapshot's end is acknowledged.
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (!primary.replication.CheckInSync().ok() && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return primary.replication.CheckInSync().ok();
  };
  StreamPair to_b;
  std::thread serve_b;
  ASSERT_TRUE(join(&to_b, &backup, &serve_b));
  ASSERT_TRUE(testing::Streamed(&to_b, &backup, [&] {
                return primary.replication.Declare(declare).status();
              }).ok());
  v1::PushResponse answer;
  ASSERT_TRUE(testing::Streamed(&to_b, &backup, [&] {
                return primary.replication.Push(SmallModelPush(3.0f),
                                                PushPolicy(), &answer);
              }).ok());
  EXPECT_EQ(Weights(&backup.store), std::vector<float>(4, 7.0f));
  // The backup goes while push 8 streams (it has the op, and leaves
  // without acknowledging it): applied on the primary alone.
  v1::PushRequest push = SmallModelPush(2.0f);
  push.set_client_id(42);
  push.set_sequence(8);
  ASSERT_EQ(primary.ledger.Begin(push, &answer), PushLedger::Verdict::kApply);
  std::thread leave([&] {
    v1::ReplicaOp op;
    EXPECT_TRUE(testing::ReadOp(to_b.b.get(), &op).ok());
    ShutdownSocket(to_b.b->fd());
  });
  ASSERT_TRUE(primary.replication.Push(push, PushPolicy(), &answer).ok());
  leave.join();
  serve_b.join();
  EXPECT_EQ(Weights(&primary.store), std::vector<float>(4, 5.0f));
  EXPECT_FALSE(primary.replication.CheckInSync().ok());
  v1::PushResponse retried;  // The answer is remembered: not applied again.
  EXPECT_EQ(primary.ledger.Begin(push, &retried),
            PushLedger::Verdict::kAnswered);
  // A new push is refused before it is applied.
  absl::Status refused =
      primary.replication.Push(SmallModelPush(1.0f), PushPolicy(), &answer);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_EQ(Weights(&primary.store), std::vector<float>(4, 5.0f));
  EXPECT_GE(primary.replication.Stats().below_min_insync(), 2);
  // A backup joins with push 8 and its answer: the group is writable.
  StreamPair to_c;
  std::thread serve_c;
  ASSERT_TRUE(join(&to_c, &later, &serve_c));
  EXPECT_EQ(Weights(&later.store), std::vector<float>(4, 5.0f));
  EXPECT_EQ(later.ledger.Begin(push, &retried), PushLedger::Verdict::kAnswered);
  EXPECT_EQ(primary.replication.Stats().in_sync(), 2);
  primary.replication.Fence("test over");
  serve_c.join();
}

// An assignment (a worker's weights, a load_state_dict) is a change too:
// below min_insync it is refused before it is applied.
TEST(Replication, BelowMinInsyncAnAssignmentIsRefused) {
  Member primary("p");
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = SmallModel();
  ASSERT_TRUE(primary.replication.Declare(declare).ok());  // min_insync 1.
  primary.replication.set_min_insync(2);
  v1::AssignRequest assign;
  *assign.add_weights() = testing::SmallModelSlice(3.0f);
  absl::Status s = primary.replication.Assign(assign, false);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_EQ(Weights(&primary.store), std::vector<float>(4, 10.0f));
}

// Issue #40, "Only a member may join": a primary with a member token takes
// no backup without it (a worker's token is not one), nor one its
// JoinCheck (the coordinator's member list) refuses, and sends neither any
// state.
TEST(Replication, OnlyAMemberMayJoin) {
  Member primary("p"), backup("b");
  const std::string token = "members-0123456789abcdef";
  primary.replication.set_member_token(token);
  std::vector<std::string> checked;
  primary.replication.set_join_check([&](const std::string& m) {
    checked.push_back(m);
    return m == "b" ? absl::OkStatus()
                    : absl::PermissionDeniedError(m + " is not listed");
  });
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  StreamPair streams;
  v1::ReplicaJoin join;
  join.set_epoch(1);
  join.set_member("b");
  for (const auto& [sent, why] :
       std::vector<std::pair<std::string, std::string>>{
           {"", "did not send"},
           {"a-worker-token-0123456789", "does not match"}}) {
    join.set_member_token(sent);
    absl::Status s = primary.replication.ServeBackup(streams.a.get(), join);
    EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
    EXPECT_NE(s.message().find(why), absl::string_view::npos) << s;
    EXPECT_EQ(s.message().find(token), absl::string_view::npos) << s;
  }
  join.set_member_token(token);
  join.set_member("x");
  absl::Status s = primary.replication.ServeBackup(streams.a.get(), join);
  EXPECT_EQ(s.code(), absl::StatusCode::kPermissionDenied) << s;
  EXPECT_EQ(checked, std::vector<std::string>{"x"});
  char byte;
  EXPECT_EQ(recv(streams.b->fd(), &byte, 1, MSG_DONTWAIT), -1)
      << "state went to a process that may not join";
  EXPECT_EQ(primary.replication.Stats().backups_size(), 0);

  join.set_member("b");
  std::thread serve([&] {
    EXPECT_FALSE(primary.replication.ServeBackup(streams.a.get(), join).ok());
  });
  backup.replication.BecomeBackup(1, "p");
  EXPECT_TRUE(FollowSnapshot(streams.b.get(), &backup.replication).ok());
  primary.replication.Fence("test over");
  serve.join();
}

// The chunks of `store`'s snapshot, and the end that counts them.
std::vector<v1::ReplicaSnapshotChunk> Chunks(const ShardStore& store,
                                             v1::ReplicaSnapshotEnd* end) {
  std::vector<v1::ReplicaSnapshotChunk> chunks;
  ChunkEncoder encoder(1024, [&](std::string bytes, uint32_t crc) {
    v1::ReplicaSnapshotChunk c;
    c.set_index(chunks.size());
    c.set_crc32(crc);
    c.set_chunk(std::move(bytes));
    chunks.push_back(std::move(c));
    return absl::OkStatus();
  });
  EXPECT_TRUE(store.Snapshot(true, 0, &encoder).ok());
  end->set_chunks(encoder.chunks());
  end->set_bytes(encoder.bytes());
  end->set_crc32(encoder.crc());
  return chunks;
}

// A backup takes nothing of a snapshot that is not whole and intact: a
// damaged chunk, one out of order, a bad whole checksum, a missing chunk.
TEST(Replication, ABackupAppliesNoDamagedOrPartialSnapshot) {
  ShardStore primary(0, 1, 64 << 20);
  ASSERT_TRUE(primary.Declare(testing::ChunkyModel()).ok());
  v1::PushResponse answer;
  ASSERT_TRUE(primary.Push(testing::ChunkyModelPush(1.0f), &answer).ok());
  v1::ReplicaSnapshotEnd end;
  const std::vector<v1::ReplicaSnapshotChunk> chunks = Chunks(primary, &end);
  ASSERT_GT(chunks.size(), 30u);
  v1::ReplicaSnapshot begin;
  v1::LedgerEntry* entry = begin.add_ledger();
  entry->set_client_id(5);
  entry->set_sequence(6);

  // Feeds every chunk (`damage` may change one) and the end.
  auto feed =
      [&](ShardStore* store, const v1::ReplicaSnapshotEnd& last,
          const std::function<void(size_t, v1::ReplicaSnapshotChunk*)>& damage)
      -> absl::Status {
    SnapshotIn in(store, /*tables=*/nullptr, begin);
    for (size_t i = 0; i < chunks.size(); ++i) {
      v1::ReplicaSnapshotChunk c = chunks[i];
      damage(i, &c);
      if (c.index() == UINT64_MAX) continue;  // Dropped.
      RETURN_IF_ERROR(in.Chunk(c));
    }
    PushLedger ledger;
    return in.End(last, &ledger);
  };
  auto none = [](size_t, v1::ReplicaSnapshotChunk*) {};
  {
    ShardStore store(0, 1, 64 << 20);
    absl::Status s = feed(&store, end, [](size_t i, auto* c) {
      if (i == 9) (*c->mutable_chunk())[5] ^= 1;
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("chunk 9: checksum mismatch"),
              absl::string_view::npos)
        << s;
    EXPECT_FALSE(store.declared());
  }
  {
    ShardStore store(0, 1, 64 << 20);
    absl::Status s = feed(&store, end, [](size_t i, auto* c) {
      if (i == 4) c->set_index(UINT64_MAX);
    });
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("chunk 5 where 4 was due"),
              absl::string_view::npos)
        << s;
    EXPECT_FALSE(store.declared());
  }
  {
    ShardStore store(0, 1, 64 << 20);
    v1::ReplicaSnapshotEnd bad = end;
    bad.set_crc32(end.crc32() ^ 1);
    absl::Status s = feed(&store, bad, none);
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(s.message().find("whole checksum"), absl::string_view::npos);
    EXPECT_FALSE(store.declared());
    bad = end;
    bad.set_chunks(end.chunks() + 1);
    EXPECT_EQ(feed(&store, bad, none).code(), absl::StatusCode::kDataLoss);
    EXPECT_FALSE(store.declared());
  }
  ShardStore store(0, 1, 64 << 20);
  SnapshotIn in(&store, /*tables=*/nullptr, begin);
  for (const auto& c : chunks) ASSERT_TRUE(in.Chunk(c).ok());
  EXPECT_FALSE(store.declared());  // Not before the end.
  PushLedger ledger;
  absl::Status ended = in.End(end, &ledger);
  ASSERT_TRUE(ended.ok()) << ended;
  v1::PushRequest retry;
  retry.set_client_id(5);
  retry.set_sequence(6);
  v1::PushResponse remembered;
  EXPECT_EQ(ledger.Begin(retry, &remembered), PushLedger::Verdict::kAnswered);
  EXPECT_EQ(store.Snapshot(true)->SerializeAsString(),
            primary.Snapshot(true)->SerializeAsString());
}

}  // namespace
}  // namespace asyncps
