// An elastic job's membership (ps_server --elastic, docs/ELASTIC.md), in
// process with a manual clock: any rank and size are taken, a worker that
// joins bsp counts from the step after the front, one that joins async or
// ssp starts at the slowest live clock, and a bsp step is the mean of the
// members that sent it as workers join and leave.
#include <optional>
#include <vector>

#include "gtest/gtest.h"
#include "server/consistency.h"
#include "server/membership.h"
#include "tests/server/consistency_fixture.h"

namespace asyncps {
namespace {

using testing::ConsistencyTest;
using testing::Pulled;

v1::RegisterRequest Join(int rank, int num_workers, int64_t clock = 0) {
  v1::RegisterRequest r;
  r.set_rank(rank);
  r.set_num_workers(num_workers);
  r.set_clock(clock);
  return r;
}

Membership Elastic(Clock* clock, Membership::Resume resume) {
  return Membership(clock, absl::Seconds(2), resume, /*job_workers=*/0,
                    absl::ZeroDuration(), /*elastic=*/true);
}

// The edge of the fixed-size rule: a job of 2 gives no third rank, and
// refuses a worker started with another size; an elastic one takes both.
TEST(ElasticMembership, AnyRankAndSizeJoinAndAreToldWhoIsLive) {
  ManualClock clock;
  Membership fixed(&clock, absl::Seconds(2));
  ASSERT_TRUE(fixed.Register(Join(0, 2)).ok());
  ASSERT_TRUE(fixed.Register(Join(1, 2)).ok());
  EXPECT_EQ(fixed.Register(Join(-1, 2)).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(fixed.Register(Join(-1, 3)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(fixed.Register(Join(5, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);

  Membership m = Elastic(&clock, Membership::Resume::kJobFront);
  auto first = m.Register(Join(0, 2));
  ASSERT_TRUE(first.ok());
  // Rank 1 has not come yet: the job's first workers split by its start.
  EXPECT_EQ(first->start_size(), 2);
  EXPECT_EQ(m.StartSize(), 2);
  auto second = m.Register(Join(1, 2));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->start_size(), 0);
  EXPECT_EQ(m.StartSize(), 0);
  auto third = m.Register(Join(-1, 2));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->rank(), 2);
  EXPECT_TRUE(third->elastic());
  auto other_size = m.Register(Join(-1, 7));
  ASSERT_TRUE(other_size.ok()) << other_size.status();
  EXPECT_EQ(other_size->rank(), 3);
  EXPECT_EQ(std::vector<int>(other_size->live_ranks().begin(),
                             other_size->live_ranks().end()),
            (std::vector<int>{0, 1, 2, 3}));
  auto far = m.Register(Join(9, 1));
  ASSERT_TRUE(far.ok());
  EXPECT_EQ(m.Expected(), 2);  // The first registration's: a bsp start.
  EXPECT_EQ(m.Register(Join(kMaxRank, 1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Ranks 1 and 9 go silent: neither is live any more.
  clock.Advance(absl::Seconds(1));
  for (int r : {0, 2, 3}) m.Touch(r, 0);
  clock.Advance(absl::Seconds(1.5));
  EXPECT_EQ(m.LiveRanks(), (std::vector<int>{0, 2, 3}));
  auto again = m.Register(Join(-1, 2));  // The lowest rank not live.
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank(), 1);
}

// bsp: the job is in step 5 (front 5); a worker joining now resumes at 5,
// sends step 6 first, and is left out of step 5's quorum, so step 5 does
// not wait for it; from step 6 it counts.
TEST(ElasticMembership, ABspJoinerCountsFromTheStepAfterTheFront) {
  ManualClock clock;
  Membership m = Elastic(&clock, Membership::Resume::kJobFront);
  ASSERT_TRUE(m.Register(Join(0, 2)).ok());
  ASSERT_TRUE(m.Register(Join(1, 2)).ok());
  EXPECT_EQ(m.LiveCount(), 2);  // Before any step: the members of step 1.
  m.Touch(0, 5);
  m.Touch(1, 5);
  auto joiner = m.Register(Join(-1, 2));
  ASSERT_TRUE(joiner.ok());
  EXPECT_EQ(joiner->resume_clock(), 5);
  EXPECT_EQ(m.LiveCount(), 2);
  EXPECT_EQ(m.LiveRanks().size(), 3u);
  m.Touch(0, 6);  // Step 5 is done: someone sends step 6.
  EXPECT_EQ(m.LiveCount(), 3);
  // A member re-registering with a restarted shard says where it is and
  // counts from there (its push of the step in progress is a member's).
  ManualClock clock2;
  Membership fresh = Elastic(&clock2, Membership::Resume::kJobFront);
  ASSERT_TRUE(fresh.Register(Join(0, 2, /*clock=*/8)).ok());
  ASSERT_TRUE(fresh.Register(Join(1, 2, /*clock=*/8)).ok());
  EXPECT_EQ(fresh.LiveCount(), 0);  // They send step 9; front 8.
  fresh.Touch(0, 9);
  EXPECT_EQ(fresh.LiveCount(), 2);
  // The first step a joiner sends travels with the membership's state.
  v1::MembershipState state = m.Export();
  ManualClock clock3;
  Membership backup = Elastic(&clock3, Membership::Resume::kJobFront);
  backup.Import(state);
  EXPECT_EQ(backup.LiveCount(), 3);
}

// async, ssp: a joiner starts at the slowest live worker's clock (at 0 it
// would hold every ssp pull of the job back), and a rank that left long
// ago and comes back is not behind it either.
TEST(ElasticMembership, AnSspJoinerStartsAtTheSlowestLiveClock) {
  ManualClock clock;
  Membership m = Elastic(&clock, Membership::Resume::kOwnClock);
  ASSERT_TRUE(m.Register(Join(0, 2)).ok());
  ASSERT_TRUE(m.Register(Join(1, 2)).ok());
  m.Touch(0, 40);
  m.Touch(1, 37);
  auto joiner = m.Register(Join(-1, 2));
  ASSERT_TRUE(joiner.ok());
  EXPECT_EQ(joiner->rank(), 2);
  EXPECT_EQ(joiner->resume_clock(), 37);
  EXPECT_EQ(m.MinLiveClock(), 37);
  // Not elastic: a new rank starts at 0 (a replacement's data position).
  Membership fixed(&clock, absl::Seconds(2), Membership::Resume::kOwnClock);
  ASSERT_TRUE(fixed.Register(Join(0, 3)).ok());
  fixed.Touch(0, 40);
  auto second = fixed.Register(Join(1, 3));
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->resume_clock(), 0);
}

// --exit_when_done: a job of 2 whose ranks 0 and 1 finished is not done
// while a worker that joined is still training; it is once that one has
// left, or has been silent past --worker_timeout (SIGKILLed).
// A shard that (re)started presumes for --worker_timeout the ranks it has
// not heard from since. In an elastic job those are the live ranks the
// first worker to register again knew of (RegisterRequest.known_live), not
// [0, num_workers): ranks may have moved past those, and a step must not
// wait for one that left (nor go without one past the starting size).
TEST(ElasticMembership, ARestartedShardPresumesTheRanksAWorkerKnewLive) {
  ManualClock clock;
  Membership m = Elastic(&clock, Membership::Resume::kJobFront);
  v1::RegisterRequest again = Join(0, 2, 10);
  for (int r : {0, 2, 5, 5}) again.add_known_live(r);
  ASSERT_TRUE(m.Register(again).ok());
  EXPECT_EQ(m.Presumed(), 2);  // Ranks 2 and 5, not rank 1.
  v1::RegisterRequest five = Join(5, 2, 10);
  five.add_known_live(1);  // Told later: the first list stands.
  ASSERT_TRUE(m.Register(five).ok());
  EXPECT_EQ(m.Presumed(), 1);  // Rank 2.
  clock.Advance(absl::Seconds(2.5));
  EXPECT_EQ(m.Presumed(), 0);

  // Restarted (promoted) again: the next worker's list is the one.
  m.Restarted();
  m.Touch(0, 11);
  v1::RegisterRequest two = Join(2, 2, 11);
  two.add_known_live(0);
  two.add_known_live(2);
  ASSERT_TRUE(m.Register(two).ok());
  EXPECT_EQ(m.Presumed(), 0);  // Rank 5 is silent but not presumed.

  // Hostile lists change nothing.
  for (int bad : {-1, kMaxRank}) {
    v1::RegisterRequest r = Join(3, 2);
    r.add_known_live(bad);
    const auto refused = m.Register(r);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("known_live"), std::string::npos)
        << refused.status();
  }
  EXPECT_EQ(m.LiveRanks(), (std::vector<int>{0, 2}));

  // A fixed-size job keeps [0, num_workers).
  Membership fixed(&clock, absl::Seconds(2), Membership::Resume::kJobFront,
                   /*job_workers=*/2);
  v1::RegisterRequest zero = Join(0, 2, 4);
  zero.add_known_live(7);
  ASSERT_TRUE(fixed.Register(zero).ok());
  EXPECT_EQ(fixed.Presumed(), 1);  // Rank 1.
}

TEST(ElasticMembership, TheJobIsNotDoneWhileAJoinerTrains) {
  ManualClock clock;
  Membership m = Elastic(&clock, Membership::Resume::kOwnClock);
  std::vector<v1::RegisterResponse> joined;
  for (int r : {0, 1, -1}) {
    auto j = m.Register(Join(r, 2));
    ASSERT_TRUE(j.ok());
    joined.push_back(*j);
  }
  auto leave = [&](const v1::RegisterResponse& j) {
    v1::HeartbeatRequest bye;
    bye.set_rank(j.rank());
    bye.set_incarnation(j.incarnation());
    bye.set_secret(j.secret());
    bye.set_leaving(true);
    ASSERT_TRUE(m.Heartbeat(bye).ok());
  };
  leave(joined[0]);
  leave(joined[1]);
  EXPECT_FALSE(m.AllFinished());
  clock.Advance(absl::Seconds(3));  // Rank 2 silent past the timeout.
  EXPECT_TRUE(m.AllFinished());
  Membership fixed(&clock, absl::Seconds(2), Membership::Resume::kOwnClock);
  auto a = fixed.Register(Join(0, 1));
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(fixed.AllFinished());
}

class ElasticBspTest : public ConsistencyTest {
 protected:
  ElasticBspTest() : ConsistencyTest(/*elastic=*/true) {}
  void SetUp() override {
    ConsistencyConfig config;
    config.mode = Mode::kBsp;
    Start(config, 2);
  }
  // Runs step `step` with `pushes` (rank, gradient value) and returns the
  // weight rank `puller` pulls after it (the step must complete).
  float Step(int64_t step, std::vector<std::pair<int, float>> pushes,
             int puller) {
    Pulled p;
    for (auto [rank, value] : pushes) {
      EXPECT_TRUE(Push(rank, step, value).ok()) << "rank " << rank;
    }
    Pull(&p, puller, step);
    EXPECT_TRUE(p.answer.has_value()) << "step " << step << " still held";
    if (!p.answer.has_value()) return 0.0f;
    EXPECT_TRUE(p.answer->ok()) << *p.answer;
    return p.Weight();
  }
};

// Workers 0 and 1 train; rank 2 joins during step 2 and does not hold it;
// from step 3 each step is the mean of the three; rank 1 leaves cleanly and
// step 4 is the mean of the two left; rank 0 is SIGKILLed in step 5 and
// costs that step only its --worker_timeout.
TEST_F(ElasticBspTest, EachStepIsTheMeanOfItsMembersAsTheyJoinAndLeave) {
  EXPECT_EQ(Step(1, {{0, 2.0f}, {1, 4.0f}}, 0), 10.0f - 3.0f);
  ASSERT_TRUE(Push(0, 2, 1.0f).ok());
  v1::RegisterRequest join;
  join.set_rank(-1);
  join.set_num_workers(2);
  auto joiner = membership_.Register(join);
  ASSERT_TRUE(joiner.ok());
  EXPECT_EQ(joiner->rank(), 2);
  EXPECT_EQ(joiner->resume_clock(), 2);  // Sends step 3 first.
  Pulled held;
  Pull(&held, 2, 2);  // Its first pull: step 2's result.
  EXPECT_FALSE(held.answer.has_value());
  EXPECT_EQ(Step(2, {{1, 3.0f}}, 1), 7.0f - 2.0f);  // Without rank 2.
  ASSERT_TRUE(held.answer.has_value() && held.answer->ok());
  EXPECT_EQ(held.Weight(), 5.0f);
  // Step 3 waits for all three.
  ASSERT_TRUE(Push(0, 3, 3.0f).ok());
  ASSERT_TRUE(Push(1, 3, 6.0f).ok());
  Pulled p3;
  Pull(&p3, 0, 3);
  EXPECT_FALSE(p3.answer.has_value());
  ASSERT_TRUE(Push(2, 3, 9.0f).ok());
  ASSERT_TRUE(p3.answer.has_value() && p3.answer->ok());
  EXPECT_EQ(p3.Weight(), 5.0f - 6.0f);
  // Rank 1 is SIGKILLed: step 4 waits for it until --worker_timeout,
  // then is the mean of the two left.
  ASSERT_TRUE(Push(0, 4, 2.0f).ok());
  ASSERT_TRUE(Push(2, 4, 4.0f).ok());
  Pulled p4;
  Pull(&p4, 2, 4);
  consistency_->Tick();
  EXPECT_FALSE(p4.answer.has_value());
  for (int i = 0; i < 3; ++i) {
    clock_.Advance(absl::Seconds(2));
    membership_.Touch(0, 4);
    membership_.Touch(2, 4);
  }
  consistency_->Tick();
  ASSERT_TRUE(p4.answer.has_value() && p4.answer->ok());
  EXPECT_EQ(p4.Weight(), -1.0f - 3.0f);
  // Rank 2 leaves cleanly after step 4 (SIGTERM: its last heartbeat):
  // step 5 is rank 0's alone, and waits for nobody.
  v1::HeartbeatRequest bye;
  bye.set_rank(2);
  bye.set_incarnation(joiner->incarnation());
  bye.set_secret(joiner->secret());
  bye.set_clock(4);
  bye.set_leaving(true);
  ASSERT_TRUE(membership_.Heartbeat(bye).ok());
  EXPECT_EQ(Step(5, {{0, 2.0f}}, 0), -4.0f - 2.0f);
}

}  // namespace
}  // namespace asyncps
