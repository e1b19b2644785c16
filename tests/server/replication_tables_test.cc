// Replicated embedding tables (issue #40): a table's declaration, every
// push of its rows and every bsp step the primary's housekeeping applies
// stream to the backups in the primary's order, and a joining backup's
// snapshot holds the tables, the rows' push ledger and each table's bsp
// step in progress. So a promoted backup holds exactly the primary's rows
// and answers a retried push of rows instead of applying it again.
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/rows.h"
#include "tests/server/replication_pair.h"

namespace asyncps {
namespace {

using testing::JoinBackup;
using testing::Member;
using testing::Streamed;
using testing::StreamPair;

const absl::Time kT0 = absl::FromUnixSeconds(3600);

// Table "e": rows of 2, every element 10 at first, SGD with learning rate
// 1 (a gradient g moves a row by exactly -g).
v1::EmbeddingSpec Spec() {
  v1::EmbeddingSpec s;
  s.set_name("e");
  s.set_dim(2);
  s.mutable_init()->set_kind(v1::Initializer::CONSTANT);
  s.mutable_init()->set_value(10.0f);
  s.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  s.mutable_optimizer()->set_learning_rate(1.0f);
  return s;
}

v1::PushRowsRequest RowsPush(int rank, int64_t clock,
                             const std::vector<int64_t>& ids,
                             const std::vector<float>& grads) {
  v1::PushRowsRequest r;
  r.set_table("e");
  r.set_rank(rank);
  r.set_clock(clock);
  r.set_ids(std::string(reinterpret_cast<const char*>(ids.data()),
                        ids.size() * sizeof(int64_t)));
  r.set_grads(std::string(reinterpret_cast<const char*>(grads.data()),
                          grads.size() * sizeof(float)));
  return r;
}

// Rows 7 and 9 of `m`'s table.
std::vector<float> Rows(Member* m) {
  const std::vector<int64_t> ids = {7, 9};
  std::vector<float> rows(4);
  EXPECT_TRUE((*m->tables.Find("e"))->Pull(ids, absl::MakeSpan(rows)).ok());
  return rows;
}

// The table as a replica's snapshot holds it (its bsp step in progress
// too), for comparing two members byte for byte.
std::string Saved(Member* m) {
  v1::EmbeddingCheckpoint saved;
  (*m->tables.Find("e"))->Save(&saved, /*pending=*/true);
  return saved.SerializeAsString();
}

PushPolicy Bsp() {
  PushPolicy p;
  p.mode = Mode::kBsp;
  return p;
}

RowPolicy BspRows(absl::Time now) {
  RowPolicy p;
  p.bsp = true;
  p.quorum = 2;
  p.now = now;
  return p;
}

// bsp, 2 ranks: rank 0 pushed step 1 (row 7 twice: summed) before the
// backup joined; the snapshot carries the table, that push's answer and
// the step in progress, so rank 1's push completes the step on both
// members alike, a retry of rank 0's push is answered from the promoted
// backup's ledger, and a step the primary applies past its deadline, or
// heals past a rank that said it completed it, is applied on the backup
// too.
TEST(ReplicatedTables, ABackupJoiningMidStepHoldsTheTableItsLedgerAndTheStep) {
  Member primary("p", Bsp()), backup("b", Bsp());
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  ASSERT_TRUE(
      primary.replication.DeclareEmbedding(Spec(), absl::OkStatus()).ok());
  v1::PushRowsRequest first = RowsPush(0, 1, {7, 7}, {1, 2, 1, 0});
  first.set_client_id(5);
  first.set_sequence(1);
  v1::PushRowsResponse answer;
  ASSERT_TRUE(primary.replication.PushRows(first, BspRows(kT0), &answer).ok());

  StreamPair streams;
  std::thread serve = JoinBackup(&primary, &backup, &streams);
  ASSERT_FALSE(HasFailure());
  ASSERT_TRUE(backup.tables.Find("e").ok()) << "the snapshot lost the table";
  EXPECT_EQ(Saved(&backup), Saved(&primary));

  // Rank 1 completes step 1: the mean over 2 ranks of row 7's (1+1+2,
  // 2+0+2) and row 9's (4, 4).
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                return primary.replication.PushRows(
                    RowsPush(1, 1, {7, 9}, {2, 2, 4, 4}), BspRows(kT0),
                    &answer);
              }).ok());
  const std::vector<float> after_1 = {8, 8, 8, 8};
  EXPECT_EQ(Rows(&primary), after_1);
  EXPECT_EQ(Rows(&backup), after_1)
      << "the step in progress was not in the "
         "snapshot, or rank 1's push not streamed";
  v1::PushRowsResponse retried;
  EXPECT_EQ(backup.tables.ledger().Begin(first, &retried),
            RowsLedger::Verdict::kAnswered)
      << "a retry of rank 0's push would be applied a second time";

  // Step 2: rank 0 alone, then the primary's tick past the deadline.
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                return primary.replication.PushRows(RowsPush(0, 2, {9}, {2, 2}),
                                                    BspRows(kT0), &answer);
              }).ok());
  ShardStore::StepAdvance tick;
  tick.quorum = 2;
  tick.live_workers = 2;
  tick.deadline = absl::Seconds(1);
  tick.now = kT0 + absl::Seconds(5);
  ShardStore::StepsAdvanced done;
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                done = primary.replication.AdvanceSteps(tick);
                return absl::OkStatus();
              }).ok());
  EXPECT_TRUE(done.changed());
  const std::vector<float> after_2 = {8, 8, 6, 6};  // 2 over the 1 rank.
  EXPECT_EQ(Rows(&primary), after_2);
  EXPECT_EQ(Rows(&backup), after_2);
  EXPECT_EQ(Saved(&backup), Saved(&primary));

  // Step 3: rank 0 alone, healed past rank 1, which said it completed the
  // step (its share was lost): the backup heals it too, by what the
  // primary saw (a backup hears no heartbeats).
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                return primary.replication.PushRows(RowsPush(0, 3, {7}, {4, 4}),
                                                    BspRows(kT0), &answer);
              }).ok());
  tick.deadline = absl::ZeroDuration();
  tick.heal = true;
  tick.heal_after = absl::Seconds(1);
  tick.live_ranks = {0, 1};
  tick.not_sending.done = {{0, 2}, {1, 3}};
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                done = primary.replication.AdvanceSteps(tick);
                return absl::OkStatus();
              }).ok());
  ASSERT_EQ(done.healed.size(), 1u);
  const std::vector<float> after_3 = {4, 4, 6, 6};
  EXPECT_EQ(Rows(&primary), after_3);
  EXPECT_EQ(Rows(&backup), after_3);
  EXPECT_EQ(Saved(&backup), Saved(&primary));

  primary.replication.Fence("test over");
  serve.join();
}

// async: a refused push of rows (a NaN) and a retry answered from the
// ledger stream nothing; a table of another spec is refused; a shard with
// tables and no dense model sends them in its snapshot.
TEST(ReplicatedTables, OnlyWhatChangedATableStreams) {
  Member primary("p"), backup("b");
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  ASSERT_TRUE(
      primary.replication.DeclareEmbedding(Spec(), absl::OkStatus()).ok());
  v1::PushRowsResponse answer;
  RowPolicy async;
  async.now = kT0;
  v1::PushRowsRequest push = RowsPush(0, 1, {7}, {1, 1});
  push.set_client_id(9);
  push.set_sequence(3);
  ASSERT_TRUE(primary.replication.PushRows(push, async, &answer).ok());

  StreamPair streams;
  std::thread serve = JoinBackup(&primary, &backup, &streams);
  ASSERT_FALSE(HasFailure());
  EXPECT_FALSE(backup.store.declared());
  EXPECT_EQ(Rows(&backup), (std::vector<float>{9, 9, 10, 10}));
  const uint64_t streamed = primary.replication.Stats().applied_seq();

  ASSERT_TRUE(primary.replication.PushRows(push, async, &answer).ok());
  const float nan = std::nanf("");
  absl::Status refused = primary.replication.PushRows(
      RowsPush(0, 1, {9}, {nan, 0}), async, &answer);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  v1::EmbeddingSpec other = Spec();
  other.set_dim(3);
  EXPECT_EQ(
      primary.replication.DeclareEmbedding(other, absl::OkStatus()).code(),
      absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(
      primary.replication.DeclareEmbedding(Spec(), absl::OkStatus()).ok());
  EXPECT_EQ(primary.replication.Stats().applied_seq(), streamed)
      << "a retry, a refused push or a declaration of a table there streamed";
  EXPECT_EQ(Rows(&primary), (std::vector<float>{9, 9, 10, 10}));

  // The next change streams as the next op.
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                return primary.replication.PushRows(RowsPush(0, 2, {9}, {3, 3}),
                                                    async, &answer);
              }).ok());
  EXPECT_EQ(Rows(&backup), (std::vector<float>{9, 9, 7, 7}));

  primary.replication.Fence("test over");
  serve.join();
}

}  // namespace
}  // namespace asyncps
