// Consistency in-process with a manual clock: ssp holds a pull until the
// slowest live worker is close enough, bsp holds it until its step is
// applied, held pulls expire at their deadline, a dead worker stops holding
// anyone, and shutdown answers everything held.
#include "server/consistency.h"

#include <optional>
#include <vector>

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

  // Pulls as `rank` at `clock`, with a deadline `timeout` from now.
  void Pull(Pulled* p, int rank, int64_t clock,
            absl::Duration timeout = absl::Seconds(10)) {
    p->request.set_rank(rank);
    p->request.set_clock(clock);
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
  Pull(&p, 0, 3);
  EXPECT_FALSE(p.answer.has_value());  // Rank 1 has not joined: clock 0.
  v1::RegisterRequest join;
  join.set_rank(1);
  join.set_num_workers(2);
  ASSERT_TRUE(membership_.Register(join).ok());
  membership_.Touch(1, 2);
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
  EXPECT_EQ(store_.Counters().steps_short, 1);
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
}

}  // namespace
}  // namespace asyncps
