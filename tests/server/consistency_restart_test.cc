// Consistency on a shard that restarted (in-process, manual clock): the
// ranks of the job it has not heard from since count for --worker_timeout
// (ssp as clock 0, bsp as presumed there), a rank that left holds nobody
// past it, a shard of unknown size completes no step by count, and a shard
// restored from a checkpoint behind the job catches up with the step its
// workers report (from a push or from heartbeats).
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/consistency.h"
#include "tests/server/consistency_fixture.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

using testing::ConsistencyTest;
using testing::Pulled;

// Regression (issue #38, chaos sweep bsp, 2 workers, no checkpoints, seed
// 19): shard 1 restarted and lost rank 1's gradient of a step; rank 1 had
// completed the step (its heartbeats said so) and waited on shard 0 for
// the next one, where rank 0 never came: rank 0 waited here for rank 1's
// lost share. A live rank missing from a pending step that it says it
// completed (heartbeat or registration) will not send it, as one blocked in
// a held pull here will not: after --heal_after the step is applied with
// what came. A rank that has not said so is waited for.
TEST_F(ConsistencyTest, BspHealsAStepWhoseMissingRankSaysItCompletedIt) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.heal_after = absl::Seconds(3);
  Start(config, 0);
  std::vector<v1::RegisterResponse> joined;
  for (int rank = 0; rank < 2; ++rank) {
    v1::RegisterRequest join;
    join.set_rank(rank);
    join.set_num_workers(2);
    auto r = membership_.Register(join);
    ASSERT_TRUE(r.ok()) << r.status();
    joined.push_back(*r);
  }
  auto heartbeat = [&](int rank, int64_t clock) {
    v1::HeartbeatRequest beat;
    beat.set_rank(rank);
    beat.set_incarnation(joined[rank].incarnation());
    beat.set_secret(joined[rank].secret());
    beat.set_clock(clock);
    ASSERT_TRUE(membership_.Heartbeat(beat).ok());
  };
  auto tick = [&](int64_t rank1_says) {
    clock_.Advance(absl::Seconds(1));
    heartbeat(0, 0);
    heartbeat(1, rank1_says);
    consistency_->Tick();
  };
  ASSERT_TRUE(Push(0, 1, 2.0f).ok());
  Pulled first;
  Pull(&first, 0, 1, absl::Seconds(60), /*after_push=*/true);
  // Rank 1 completed step 1: its share was lost with the restart.
  for (int s = 0; s < 2; ++s) tick(1);
  EXPECT_FALSE(first.answer.has_value()) << "healed before --heal_after";
  tick(1);
  ASSERT_TRUE(first.answer.has_value()) << "step 1 held for ever";
  EXPECT_TRUE(first.answer->ok()) << *first.answer;
  EXPECT_EQ(first.Weight(), 10.0f - 2.0f);  // Rank 0's gradient alone.
  EXPECT_EQ(store_.Counters()[ShardCounter::kStepsShort], 1);
  // Step 2: rank 1 says it completed step 1 only, so it may still send.
  ASSERT_TRUE(Push(0, 2, 1.0f).ok());
  Pulled second;
  Pull(&second, 0, 2, absl::Seconds(60), /*after_push=*/true);
  for (int s = 0; s < 6; ++s) tick(1);  // Rank 1 computes step 2.
  EXPECT_FALSE(second.answer.has_value()) << "rank 1 may still push step 2";
  ASSERT_TRUE(Push(1, 2, 3.0f).ok());
  ASSERT_TRUE(second.answer.has_value());
  EXPECT_EQ(second.Weight(), 8.0f - 2.0f);  // The mean of 1 and 3.
}

// Issue #38 (the staleness bound at its edge): a restarted ssp shard took
// the slowest clock from the ranks heard since, so rank 0 at clock 41 ran
// on while rank 1, not heard yet, might be far behind. A rank of the job
// not heard from since the restart counts as clock 0 for --worker_timeout,
// as bsp presumes it there (Membership::Presumed).
TEST_F(ConsistencyTest, SspRestartedShardHoldsForARankNotHeardSince) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  config.staleness = 2;
  Start(config, 0);
  auto join = [&](int rank, int64_t clock) {
    v1::RegisterRequest again;
    again.set_rank(rank);
    again.set_num_workers(2);
    again.set_clock(clock);
    ASSERT_TRUE(membership_.Register(again).ok());
  };
  join(0, 40);
  Pulled ahead;
  Pull(&ahead, 0, 41, absl::Seconds(60));
  consistency_->Tick();
  EXPECT_FALSE(ahead.answer.has_value()) << "rank 1's clock is unknown";
  join(1, 39);  // Within the bound: 41 - 39 <= 2.
  consistency_->Tick();
  ASSERT_TRUE(ahead.answer.has_value());
  EXPECT_TRUE(ahead.answer->ok());
}

// A rank that never comes back holds the others --worker_timeout at most.
TEST_F(ConsistencyTest, SspRestartedShardHoldsForAGoneRankOnlyAWhile) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  config.staleness = 2;
  Start(config, 0);
  v1::RegisterRequest again;
  again.set_rank(0);
  again.set_num_workers(2);
  again.set_clock(50);
  ASSERT_TRUE(membership_.Register(again).ok());
  Pulled alone;
  Pull(&alone, 0, 51, absl::Seconds(60));
  clock_.Advance(absl::Seconds(4));
  membership_.Touch(0, 51);
  consistency_->Tick();
  EXPECT_FALSE(alone.answer.has_value());
  clock_.Advance(absl::Seconds(1.5));
  membership_.Touch(0, 51);
  consistency_->Tick();
  ASSERT_TRUE(alone.answer.has_value()) << "waits for a rank that is gone";
  EXPECT_TRUE(alone.answer->ok());
}

// A shard that restarts after a worker finished and left never sees it
// register: once the job is past its start (a worker reports step 2, which
// only the whole job could reach) and --worker_timeout has passed since the
// restart without a word from it, steps go on with the live workers.
TEST_F(ConsistencyTest, BspRestartedShardDoesNotWaitForAWorkerThatLeft) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 0);
  v1::RegisterRequest survivor;  // Rank 0 of 2, re-registering at step 40.
  survivor.set_rank(0);
  survivor.set_num_workers(2);
  survivor.set_clock(40);
  ASSERT_TRUE(membership_.Register(survivor).ok());
  consistency_->Tick();  // Catches up with step 39.
  ASSERT_TRUE(Push(0, 40, 1.0f).ok());
  Pulled p;
  Pull(&p, 0, 40, absl::Seconds(60));
  EXPECT_FALSE(p.answer.has_value()) << "rank 1 may be there still";
  clock_.Advance(absl::Seconds(4));
  membership_.Touch(0, 40);
  consistency_->Tick();
  EXPECT_FALSE(p.answer.has_value());
  clock_.Advance(absl::Seconds(1.5));  // --worker_timeout since the restart.
  consistency_->Tick();
  ASSERT_TRUE(p.answer.has_value()) << "waits for rank 1, which left";
  EXPECT_TRUE(p.answer->ok());
  EXPECT_EQ(p.Weight(), 9.0f);  // Rank 0's gradient, the step's only one.
}

// Regression (issue #38, found by tools/reliability/history_check.py): a bsp
// shard that restarted went on with the ranks it had heard from since, so a
// step completed with rank 0's gradient alone (applied whole) and rank 1's,
// which came a moment later, was dropped as late. A rank of the job not
// heard from since the restart is presumed there for --worker_timeout.
TEST_F(ConsistencyTest, BspRestartedShardWaitsForEveryRankOfTheJob) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 0);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RegisterRequest again;
    again.set_rank(rank);
    again.set_num_workers(2);
    again.set_clock(40);
    if (rank == 0) {
      ASSERT_TRUE(membership_.Register(again).ok());
      consistency_->Tick();  // Catches up with step 39.
      ASSERT_TRUE(Push(0, 40, 1.0f).ok());
      continue;
    }
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(membership_.Register(again).ok());
  }
  Pulled p;
  Pull(&p, 0, 40, absl::Seconds(60));
  consistency_->Tick();
  EXPECT_FALSE(p.answer.has_value()) << "the step went without rank 1";
  ASSERT_TRUE(Push(1, 40, 3.0f).ok());
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
  EXPECT_EQ(p.Weight(), 8.0f);  // 10 - (1 + 3) / 2.
}

// A restarted shard that knows neither the job's size nor any rank yet (a
// worker's push reached it before any heartbeat registered one) completes
// no step by count until a registration says the size or --worker_timeout
// passes.
TEST_F(ConsistencyTest, BspRestartedShardOfUnknownSizeCompletesNoStepByCount) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 0);
  ASSERT_TRUE(Push(0, 1, 1.0f).ok());
  Pulled p;
  Pull(&p, 0, 1, absl::Seconds(60));
  consistency_->Tick();
  EXPECT_FALSE(p.answer.has_value());
  clock_.Advance(absl::Seconds(5.5));
  consistency_->Tick();
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
  EXPECT_EQ(p.Weight(), 9.0f);
}

// Regression (issue #21, tools/reliability/chaos.py --mode bsp --seed 7): a bsp
// shard restored from a checkpoint older than the step the job is on. A worker
// restarted meanwhile resumes at the job's front and waits for that step on
// every slice; the other pushed the next step of one tensor only (layered
// exchange) and waits for it. Slices the push did not touch stayed at the
// checkpoint's step, so the restarted worker waited for ever, and the other
// for it: both gave up after --retry_for. Now the shard catches up with
// the step its workers report having completed.
TEST(ConsistencyRestoreTest, ShardRestoredBehindTheJobCatchesUp) {
  v1::ModelSpec spec = testing::SmallModel();
  v1::TensorSpec* v = spec.add_tensors();
  *v = spec.tensors(0);
  v->set_name("v");
  ManualClock clock;
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  ShardStore before(0, 1, 64 << 20, uint64_t{4} << 30, /*incarnation=*/1);
  ASSERT_TRUE(before.Declare(spec).ok());
  auto push = [](ShardStore* store, int rank, int64_t step,
                 const std::vector<std::string>& tensors, uint64_t inc) {
    v1::PushRequest req;
    req.set_rank(rank);
    req.set_clock(step);
    for (const std::string& t : tensors) {
      v1::SliceData* g = req.add_gradients();
      *g = testing::SmallModelSlice(0.5f);
      g->mutable_key()->set_tensor(t);
      g->set_incarnation(inc);
    }
    v1::PushResponse resp;
    PushPolicy policy;
    policy.mode = Mode::kBsp;
    policy.quorum = 2;
    policy.live_workers = 2;
    return store->Push(req, policy, &resp);
  };
  std::optional<v1::ShardCheckpoint> checkpoint;
  for (int64_t step = 1; step <= 5; ++step) {
    for (int rank = 0; rank < 2; ++rank) {
      ASSERT_TRUE(push(&before, rank, step, {"w", "v"}, 1).ok());
    }
    if (step == 2) {
      absl::StatusOr<v1::ShardCheckpoint> taken = before.Snapshot();
      ASSERT_TRUE(taken.ok());
      checkpoint = *std::move(taken);
    }
  }
  // The shard dies after step 5 and comes back from the step-2 checkpoint.
  ShardStore after(0, 1, 64 << 20, uint64_t{4} << 30, /*incarnation=*/2);
  ASSERT_TRUE(after.Restore(*checkpoint).ok());
  Membership membership(&clock, absl::Seconds(5));
  Consistency consistency(config, &after, &membership, &clock);
  v1::RegisterRequest survivor;  // Rank 0 says it completed step 5.
  survivor.set_rank(0);
  survivor.set_num_workers(2);
  survivor.set_clock(5);
  ASSERT_TRUE(membership.Register(survivor).ok());
  v1::RegisterRequest replacement;  // Rank 1 restarted: resumes at 4.
  replacement.set_rank(1);
  replacement.set_num_workers(2);
  absl::StatusOr<v1::RegisterResponse> joined =
      membership.Register(replacement);
  ASSERT_TRUE(joined.ok());
  EXPECT_EQ(joined->resume_clock(), 4);
  v1::PullRequest start;  // Rank 1's first pull: step 4, everything.
  start.set_rank(1);
  start.set_clock(4);
  for (const char* t : {"w", "v"}) {
    v1::SliceKey* key = start.add_slices();
    *key = testing::SmallModelKey();
    key->set_tensor(t);
  }
  v1::PullResponse response;
  std::optional<absl::Status> answer;
  PendingCall call;
  call.deadline = clock.Now() + absl::Seconds(60);
  call.done = [&answer](absl::Status s) { answer = s; };
  consistency.Pull(start, &response, std::move(call));
  EXPECT_FALSE(answer.has_value());  // Slices at the checkpoint's step 2.
  // Rank 0 pushes step 6 of "w" only, stamped with the lost incarnation,
  // as its layered exchange does (and then waits for it).
  ASSERT_TRUE(push(&after, 0, 6, {"w"}, 1).ok());
  consistency.Tick();
  ASSERT_TRUE(answer.has_value()) << "rank 1's pull of step 4 is held";
  EXPECT_TRUE(answer->ok()) << *answer;
  EXPECT_TRUE(after.StepApplied({0, 1}, 5));
  EXPECT_FALSE(after.StepApplied({0}, 6));  // Waits for rank 1's "w".
}

// The same shard learns the job's step from heartbeats alone (no push
// reached it yet): housekeeping catches it up.
TEST(ConsistencyRestoreTest, HeartbeatsCatchUpAShardRestoredBehind) {
  ManualClock clock;
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  ShardStore store(0, 1, 64 << 20, uint64_t{4} << 30, /*incarnation=*/2);
  ASSERT_TRUE(store.Declare(testing::SmallModel()).ok());
  Membership membership(&clock, absl::Seconds(5));
  Consistency consistency(config, &store, &membership, &clock);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RegisterRequest join;
    join.set_rank(rank);
    join.set_num_workers(2);
    join.set_clock(7);  // Both were at step 7 before the restart.
    ASSERT_TRUE(membership.Register(join).ok());
  }
  EXPECT_FALSE(store.StepApplied({0}, 6));
  consistency.Tick();
  EXPECT_TRUE(store.StepApplied({0}, 6));  // The step before theirs.
  EXPECT_FALSE(store.StepApplied({0}, 7));
}

}  // namespace
}  // namespace asyncps
