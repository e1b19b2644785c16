// Consistency in-process with a manual clock: ssp holds a pull until the
// slowest live worker is close enough, bsp holds it until its step is
// applied, held pulls expire at their deadline, a dead worker stops holding
// anyone, and shutdown answers everything held. A shard that restarted:
// consistency_restart_test.cc.
#include "server/consistency.h"

#include <optional>
#include <string>
#include <vector>

#include "common/compress.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "tests/server/consistency_fixture.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

using testing::ConsistencyTest;
using testing::Pulled;

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

}  // namespace
}  // namespace asyncps
