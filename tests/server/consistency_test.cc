// Consistency in-process with a manual clock: ssp holds a pull until the
// slowest live worker is close enough, bsp holds it until its step is
// applied, held pulls expire at their deadline, a dead worker stops holding
// anyone, and shutdown answers everything held.
#include "server/consistency.h"

#include <optional>
#include <string>
#include <vector>

#include "common/compress.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

// One pull's request, response and answer.
struct Pulled {
  v1::PullRequest request;
  v1::PullResponse response;
  std::optional<absl::Status> answer;

  float Weight() const {
    std::vector<float> w(4);
    DecodeF32(response.slices(0).data(), absl::MakeSpan(w));
    return w[0];
  }
};

class ConsistencyTest : public ::testing::Test {
 protected:
  void Start(ConsistencyConfig config, int workers) {
    consistency_.emplace(config, &store_, &membership_, &clock_);
    ASSERT_TRUE(store_.Declare(testing::SmallModel()).ok());
    for (int r = 0; r < workers; ++r) {
      v1::RegisterRequest join;
      join.set_rank(r);
      join.set_num_workers(workers);
      ASSERT_TRUE(membership_.Register(join).ok());
    }
  }

  // Pulls as `rank` at `clock`, with a deadline `timeout` from now;
  // `after_push`: the pull follows the rank's push of that step.
  void Pull(Pulled* p, int rank, int64_t clock,
            absl::Duration timeout = absl::Seconds(10),
            bool after_push = false) {
    p->request.set_rank(rank);
    p->request.set_clock(clock);
    p->request.set_after_push(after_push);
    *p->request.add_slices() = testing::SmallModelKey();
    membership_.Touch(rank, clock);
    PendingCall call;
    call.deadline = clock_.Now() + timeout;
    call.done = [p](absl::Status s) {
      ASSERT_FALSE(p->answer.has_value()) << "answered twice";
      p->answer = s;
    };
    consistency_->Pull(p->request, &p->response, std::move(call));
  }

  absl::Status Push(int rank, int64_t clock, float value) {
    membership_.Touch(rank, clock);
    v1::PushResponse resp;
    return consistency_->Push(
        testing::SmallModelPush(value, /*version=*/0, rank, clock), &resp);
  }

  ManualClock clock_;
  ShardStore store_{0, 1, 64 << 20};
  Membership membership_{&clock_, absl::Seconds(5)};
  std::optional<Consistency> consistency_;
};

TEST_F(ConsistencyTest, AsyncNeverHolds) {
  ConsistencyConfig config;
  Start(config, 2);
  Pulled p;
  Pull(&p, 0, 100);
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
  EXPECT_EQ(consistency_->held_pulls(), 0);
}

TEST_F(ConsistencyTest, SspHoldsUntilTheSlowestIsWithinTheBound) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  config.staleness = 2;
  Start(config, 2);
  membership_.Touch(1, 0);
  Pulled near, far;
  Pull(&near, 0, 2);  // 2 - 0 <= 2: answered.
  ASSERT_TRUE(near.answer.has_value());
  Pull(&far, 0, 4);  // 4 - 0 > 2: held.
  EXPECT_FALSE(far.answer.has_value());
  EXPECT_EQ(consistency_->waiting(), 1u);
  membership_.Touch(1, 1);
  consistency_->ClockAdvanced();
  EXPECT_FALSE(far.answer.has_value());  // 4 - 1 > 2 still.
  membership_.Touch(1, 2);
  consistency_->ClockAdvanced();
  ASSERT_TRUE(far.answer.has_value());
  EXPECT_TRUE(far.answer->ok());
  EXPECT_EQ(far.Weight(), 10.0f);
  EXPECT_EQ(consistency_->held_pulls(), 1);
}

// The stall doctor: a bsp pull held past --stall_warn names the rank whose
// gradient the step still lacks, once, and clears when the step goes.
TEST_F(ConsistencyTest, StalledBspPullNamesTheRankItWaitsFor) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.stall_warn = absl::Seconds(2);
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, 1.0f).ok());
  Pulled p;
  Pull(&p, 0, 1, absl::Seconds(60));
  EXPECT_FALSE(p.answer.has_value());
  consistency_->Tick();
  EXPECT_EQ(consistency_->Stall(), "");  // Not yet past the threshold.
  clock_.Advance(absl::Seconds(3));      // Rank 1 still live (5 s timeout).
  consistency_->Tick();
  const std::string stall = consistency_->Stall();
  EXPECT_NE(stall.find("bsp pull of rank 0 at clock 1"), std::string::npos)
      << stall;
  EXPECT_NE(stall.find("rank 1 (clock 0, last seen 3s ago)"), std::string::npos)
      << stall;
  ASSERT_TRUE(Push(1, 1, 1.0f).ok());  // The step completes.
  ASSERT_TRUE(p.answer.has_value());
  consistency_->Tick();
  EXPECT_EQ(consistency_->Stall(), "");
}

TEST_F(ConsistencyTest, SspCountsWorkersNotYetJoinedAsClockZero) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  config.staleness = 1;
  Start(config, 0);
  v1::RegisterRequest expects_two;  // Rank 0, saying the job has 2.
  expects_two.set_rank(0);
  expects_two.set_num_workers(2);
  ASSERT_TRUE(membership_.Register(expects_two).ok());
  Pulled p;
  Pull(&p, 0, 2);
  EXPECT_FALSE(p.answer.has_value());  // Rank 1 has not joined: clock 0.
  v1::RegisterRequest join;
  join.set_rank(1);
  join.set_num_workers(2);
  ASSERT_TRUE(membership_.Register(join).ok());
  membership_.Touch(1, 1);
  consistency_->ClockAdvanced();
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
}

TEST_F(ConsistencyTest, SspHeldPullExpiresAtItsDeadline) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  Start(config, 2);
  membership_.Touch(1, 0);
  Pulled p;
  Pull(&p, 0, 5, absl::Seconds(2));
  consistency_->Tick();
  EXPECT_FALSE(p.answer.has_value());
  clock_.Advance(absl::Seconds(3));
  membership_.Touch(1, 0);  // Still live, still behind.
  consistency_->Tick();
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_EQ(p.answer->code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(p.answer->message().find("too far behind"),
            absl::string_view::npos);
}

TEST_F(ConsistencyTest, SspStopsWaitingForADeadWorker) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  Start(config, 2);
  membership_.Touch(1, 0);
  Pulled p;
  Pull(&p, 0, 5, absl::Seconds(60));
  clock_.Advance(absl::Seconds(4));
  membership_.Touch(0, 5);
  consistency_->Tick();
  EXPECT_FALSE(p.answer.has_value());
  clock_.Advance(absl::Seconds(2));  // Rank 1 silent past the timeout.
  consistency_->Tick();
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
}

TEST_F(ConsistencyTest, BspHoldsAPullUntilItsStepIsApplied) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, 2.0f).ok());
  Pulled p;
  Pull(&p, 0, 1);
  EXPECT_FALSE(p.answer.has_value());  // Step 1 waits for rank 1.
  ASSERT_TRUE(Push(1, 1, 4.0f).ok());
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
  EXPECT_EQ(p.Weight(), 10.0f - 3.0f);  // The mean, once.
}

// One client cannot pile up held pulls on a shard: past the bound (3
// here) a pull is RESOURCE_EXHAUSTED at once, and other ranks are not
// affected.
TEST_F(ConsistencyTest, HeldPullsPerRankAreBounded) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.max_held_per_rank = 3;
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, 2.0f).ok());
  Pulled held[4];
  for (Pulled& p : held) Pull(&p, 0, 1);
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(held[i].answer.has_value());
  ASSERT_TRUE(held[3].answer.has_value());
  EXPECT_EQ(held[3].answer->code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(held[3].answer->message().find("rank 0 already has 3"),
            std::string::npos)
      << *held[3].answer;
  Pulled other;
  Pull(&other, 1, 1);  // Rank 1's pull is held, not refused.
  EXPECT_FALSE(other.answer.has_value());
  ASSERT_TRUE(Push(1, 1, 4.0f).ok());  // The step completes: all go.
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(held[i].answer.has_value());
    EXPECT_TRUE(held[i].answer->ok());
  }
  ASSERT_TRUE(other.answer.has_value());
  EXPECT_TRUE(other.answer->ok());
}

TEST_F(ConsistencyTest, BspStepDeadlineAppliesAShortStep) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.step_deadline = absl::Seconds(1);
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, 2.0f).ok());
  Pulled p;
  Pull(&p, 0, 1);
  consistency_->Tick();
  EXPECT_FALSE(p.answer.has_value());
  clock_.Advance(absl::Seconds(1.5));
  consistency_->Tick();
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_TRUE(p.answer->ok());
  EXPECT_EQ(p.Weight(), 8.0f);
  EXPECT_EQ(store_.Counters()[ShardCounter::kStepsShort], 1);
}

// Healing, asked: a rank waits for a step it pushed, but its gradient is
// not on the slice (lost on the way): its pull is answered ABORTED at once,
// it pushes again, and the step's update is the mean of what came.
TEST_F(ConsistencyTest, BspAsksARankWhoseGradientIsMissingToPushAgain) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, 2.0f).ok());
  Pulled waiting;
  Pull(&waiting, 0, 1, absl::Seconds(60), /*after_push=*/true);
  EXPECT_FALSE(waiting.answer.has_value());  // Rank 0's gradient is here.
  Pulled lost;
  Pull(&lost, 1, 1, absl::Seconds(60), /*after_push=*/true);
  ASSERT_TRUE(lost.answer.has_value());
  EXPECT_EQ(lost.answer->code(), absl::StatusCode::kAborted);
  EXPECT_NE(lost.answer->message().find("push it again"), std::string::npos)
      << *lost.answer;
  ASSERT_TRUE(Push(1, 1, 4.0f).ok());  // Sent again: the step completes.
  ASSERT_TRUE(waiting.answer.has_value());
  EXPECT_TRUE(waiting.answer->ok());
  EXPECT_EQ(waiting.Weight(), 10.0f - 3.0f);
  EXPECT_EQ(store_.Counters()[ShardCounter::kStepsShort], 0);
}

// Healing, past the bound: every rank missing from a step is blocked in a
// held pull (it will not send its gradient), so after --heal_after the
// step is applied with what came, counted as short; a missing rank that is
// not blocked (still computing) is waited for.
TEST_F(ConsistencyTest, BspHealsAStepWhoseMissingRanksAllWait) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.heal_after = absl::Seconds(3);
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, 2.0f).ok());
  Pulled pusher;
  Pull(&pusher, 0, 1, absl::Seconds(60), /*after_push=*/true);
  // Rank 1 computes (no pull held): 6 s is past the bound, but rank 1 may
  // still send its gradient; heartbeats keep both live.
  for (int s = 0; s < 6; ++s) {
    clock_.Advance(absl::Seconds(1));
    membership_.Touch(0, 0);
    membership_.Touch(1, 0);
    consistency_->Tick();
  }
  EXPECT_FALSE(pusher.answer.has_value());
  // Now rank 1 blocks on the step without having pushed it (its gradient
  // is gone: say its process restarted and resumed there).
  Pulled blocked;
  Pull(&blocked, 1, 1, absl::Seconds(60));
  EXPECT_FALSE(blocked.answer.has_value());
  consistency_->Tick();  // The step is past the bound: healed now.
  ASSERT_TRUE(pusher.answer.has_value());
  ASSERT_TRUE(blocked.answer.has_value());
  EXPECT_TRUE(pusher.answer->ok());
  EXPECT_EQ(pusher.Weight(), 10.0f - 2.0f);  // Rank 0's gradient alone.
  EXPECT_EQ(blocked.Weight(), 8.0f);
  EXPECT_EQ(store_.Counters()[ShardCounter::kStepsShort], 1);
}

// Regression (issue #38, chaos sweep bsp, 2 workers, no checkpoints): a
// shard declared again after a restart caught up with the step before the
// highest clock it heard (86), while both ranks, restarted too, resumed at
// 87 and pulled it without pushing it (they hold no gradient of it). Step
// 87 had no gradient anywhere and never would: both pulls were held until
// the workers gave up. Once every live rank has waited --heal_after in a
// pull of a step nobody sent anything for, the step is skipped (changes no
// weight); a rank not waiting, or waiting less, may still push it.
TEST_F(ConsistencyTest, BspSkipsAStepNobodySentOnceEveryRankWaitsForIt) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.heal_after = absl::Seconds(3);
  Start(config, 0);
  for (int rank = 0; rank < 2; ++rank) {  // Both resume at step 40.
    v1::RegisterRequest again;
    again.set_rank(rank);
    again.set_num_workers(2);
    again.set_clock(40);
    ASSERT_TRUE(membership_.Register(again).ok());
  }
  consistency_->Tick();  // Catches up with step 39.
  Pulled first;
  Pull(&first, 0, 40, absl::Seconds(60));
  auto tick = [&](absl::Duration d) {
    clock_.Advance(d);
    membership_.Touch(0, 40);
    membership_.Touch(1, 40);
    consistency_->Tick();
  };
  tick(absl::Seconds(4));
  EXPECT_FALSE(first.answer.has_value()) << "rank 1 may still push step 40";
  Pulled second;
  Pull(&second, 1, 40, absl::Seconds(60));
  tick(absl::Seconds(2));
  EXPECT_FALSE(second.answer.has_value()) << "rank 1 waited only 2 s";
  tick(absl::Seconds(2));
  ASSERT_TRUE(first.answer.has_value()) << "step 40 held for ever";
  ASSERT_TRUE(second.answer.has_value());
  EXPECT_TRUE(first.answer->ok());
  EXPECT_TRUE(second.answer->ok());
  EXPECT_EQ(first.Weight(), 10.0f);  // Nothing applied: no gradient came.
  EXPECT_EQ(second.Weight(), 10.0f);
  ASSERT_TRUE(Push(0, 41, 2.0f).ok());  // The job goes on.
  ASSERT_TRUE(Push(1, 41, 4.0f).ok());
  Pulled next;
  Pull(&next, 0, 41, absl::Seconds(60), /*after_push=*/true);
  ASSERT_TRUE(next.answer.has_value());
  EXPECT_EQ(next.Weight(), 7.0f);  // 10 - (2 + 4) / 2.
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

// A compressed gradient (common/compress.h) is decoded and applied as the
// codec says; a malformed one is refused naming the fault, nothing moved.
TEST_F(ConsistencyTest, CompressedPushesApplyExactlyOrChangeNothing) {
  Start(ConsistencyConfig(), 1);
  auto push = [&](v1::DType dtype, const std::string& bytes) {
    v1::PushRequest r = testing::SmallModelPush(0.0f);
    r.mutable_gradients(0)->set_dtype(dtype);
    r.mutable_gradients(0)->set_data(bytes);
    v1::PushResponse response;
    return consistency_->Push(r, &response);
  };
  std::string topk;
  std::vector<float> sent(4);
  EncodeTopK({1.0f, -4.0f, 2.0f, 0.5f}, 0.5, &topk, absl::MakeSpan(sent));
  ASSERT_TRUE(push(v1::DTYPE_TOPK, topk).ok());
  std::string onebit;
  EncodeOneBit({1.0f, -1.0f, 3.0f, -3.0f}, &onebit, absl::MakeSpan(sent));
  ASSERT_TRUE(push(v1::DTYPE_ONEBIT, onebit).ok());
  Pulled p;
  Pull(&p, 0, 0);
  std::vector<float> w(4);
  DecodeF32(p.response.slices(0).data(), absl::MakeSpan(w));
  // 10 - top-2 {-4 at 1, 2 at 2}, then - (+-2: the mean magnitude).
  EXPECT_EQ(w, (std::vector<float>{8, 16, 6, 12}));
  std::string bad = topk;
  bad[4] = 9;  // The first index, now outside the slice's 4 elements.
  const absl::Status refused = push(v1::DTYPE_TOPK, bad);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  EXPECT_NE(refused.message().find("outside"), std::string::npos) << refused;
  EXPECT_TRUE(absl::IsInvalidArgument(push(v1::DTYPE_ONEBIT, "x")));
  Pulled after;
  Pull(&after, 0, 0);
  EXPECT_EQ(after.response.slices(0).data(), p.response.slices(0).data());
}

TEST_F(ConsistencyTest, BadPullIsAnsweredAtOnceAndNeverHeld) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  Pulled p;
  p.request.add_slices()->set_tensor("nope");
  PendingCall call;
  call.done = [&p](absl::Status s) { p.answer = s; };
  consistency_->Pull(p.request, &p.response, std::move(call));
  ASSERT_TRUE(p.answer.has_value());
  EXPECT_EQ(p.answer->code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(consistency_->waiting(), 0u);
}

TEST_F(ConsistencyTest, ShutdownAnswersHeldAndLaterPullsUnavailable) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  Pulled held, later;
  Pull(&held, 0, 1);
  EXPECT_FALSE(held.answer.has_value());
  consistency_->Shutdown();
  ASSERT_TRUE(held.answer.has_value());
  EXPECT_EQ(held.answer->code(), absl::StatusCode::kUnavailable);
  Pull(&later, 1, 1);
  ASSERT_TRUE(later.answer.has_value());
  EXPECT_EQ(later.answer->code(), absl::StatusCode::kUnavailable);
}

TEST_F(ConsistencyTest, AllreduceRefusesPushes) {
  ConsistencyConfig config;
  config.mode = Mode::kAllreduce;
  Start(config, 1);
  EXPECT_EQ(Push(0, 1, 1.0f).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(ConsistencyConfig, NegativeValuesAreRefusedByName) {
  ConsistencyConfig config;
  EXPECT_TRUE(config.Validate().ok());
  config.staleness = -1;
  EXPECT_NE(config.Validate().message().find("--staleness"),
            absl::string_view::npos);
  config = ConsistencyConfig();
  config.backup_workers = -1;
  EXPECT_NE(config.Validate().message().find("--backup_workers"),
            absl::string_view::npos);
  config = ConsistencyConfig();
  config.step_deadline = absl::Seconds(-1);
  EXPECT_NE(config.Validate().message().find("--step_deadline"),
            absl::string_view::npos);
  config = ConsistencyConfig();
  config.heal_after = absl::Seconds(-1);
  EXPECT_NE(config.Validate().message().find("--heal_after"),
            absl::string_view::npos);
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
// shard that
// restarted went on with the ranks it had heard from since, so a step
// completed with rank 0's gradient alone (applied whole) and rank 1's,
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

// Regression (issue #21, tools/reliability/chaos.py --mode bsp --seed 7): a
// bsp shard
// restored from a checkpoint older than the step the job is on. A worker
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
