// What keeps a job alive across deaths, in-process with a manual clock:
// gradients computed against a restarted shard's lost weights (dropped in
// async, fast-forwarded into the job's step in bsp), a lost model declared
// again and restored from a worker's copy (or not, past --restore_wait),
// retried pushes applied once, and the requests that could stall or
// corrupt a job refused.
#include <optional>
#include <vector>

#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "server/consistency.h"
#include "server/push_ledger.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

constexpr uint64_t kIncarnation = 77;

class RecoveryTest : public ::testing::Test {
 protected:
  void Start(Mode mode, bool declare = true) {
    ConsistencyConfig config;
    config.mode = mode;
    config.restore_wait = absl::Seconds(10);
    consistency_.emplace(config, &store_, &membership_, &clock_);
    if (declare) {
      ASSERT_TRUE(store_.Declare(testing::SmallModel()).ok());
    }
  }

  // A push of `value` computed from `version` of incarnation `from`.
  v1::PushRequest Grad(float value, int64_t version, uint64_t from,
                       int rank = 0, int64_t clock = 1) {
    v1::PushRequest req = testing::SmallModelPush(value, version, rank, clock);
    req.mutable_gradients(0)->set_incarnation(from);
    return req;
  }

  absl::StatusOr<float> Weight(int64_t* version = nullptr) {
    v1::PullRequest req;
    *req.add_slices() = testing::SmallModelKey();
    v1::PullResponse resp;
    std::optional<absl::Status> answer;
    PendingCall call;
    call.deadline = clock_.Now() + absl::Seconds(1);
    call.done = [&answer](absl::Status s) { answer = s; };
    consistency_->Pull(req, &resp, std::move(call));
    EXPECT_TRUE(answer.has_value());
    if (!answer->ok()) return *answer;
    EXPECT_EQ(resp.slices(0).incarnation(), kIncarnation);
    std::vector<float> w(4);
    DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
    if (version != nullptr) *version = resp.slices(0).version();
    return w[0];
  }

  ManualClock clock_;
  ShardStore store_{0, 1, 64 << 20, uint64_t{1} << 30, kIncarnation};
  Membership membership_{&clock_, absl::Seconds(5)};
  std::optional<Consistency> consistency_;
};

TEST_F(RecoveryTest, AsyncDropsAGradientOfAnEarlierIncarnation) {
  Start(Mode::kAsync);
  v1::PushResponse resp;
  // Version 500 of another incarnation: not "from the future", just lost.
  ASSERT_TRUE(consistency_->Push(Grad(1.0f, 500, 12345), &resp).ok());
  EXPECT_TRUE(resp.dropped(0));
  EXPECT_EQ(resp.incarnation(), kIncarnation);
  EXPECT_EQ(*Weight(), 10.0f);
  EXPECT_EQ(store_.Counters()[ShardCounter::kDroppedRestarted], 1);
  // Ours (or none) is checked and applied as always.
  EXPECT_EQ(consistency_->Push(Grad(1.0f, 500, kIncarnation), &resp).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(consistency_->Push(Grad(1.0f, 0, kIncarnation), &resp).ok());
  ASSERT_TRUE(consistency_->Push(Grad(1.0f, 0, 0), &resp).ok());
  EXPECT_EQ(*Weight(), 8.0f);
}

TEST_F(RecoveryTest, BspJoinsTheStepTheWorkersAreOn) {
  Start(Mode::kBsp);
  v1::RegisterRequest join;
  join.set_num_workers(1);
  ASSERT_TRUE(membership_.Register(join).ok());
  // A shard restored at step 0 while the job is at step 41: the gradient of
  // step 42, computed before the restart, completes step 42 here.
  v1::PushResponse resp;
  ASSERT_TRUE(
      consistency_->Push(Grad(2.0f, 41, 999, 0, /*clock=*/42), &resp).ok());
  EXPECT_FALSE(resp.dropped(0));
  EXPECT_EQ(resp.front_step(), 42);
  EXPECT_EQ(*Weight(), 8.0f);
  // The same step's gradient of our incarnation now is late: dropped, and
  // the answer says where the job is.
  ASSERT_TRUE(
      consistency_->Push(Grad(1.0f, 1, kIncarnation, 0, 42), &resp).ok());
  EXPECT_TRUE(resp.dropped(0));
  EXPECT_EQ(resp.front_step(), 42);
}

TEST_F(RecoveryTest, LostModelWaitsForAWorkersCopy) {
  Start(Mode::kAsync, /*declare=*/false);
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = testing::SmallModel();
  declare.set_recover(true);
  auto created = consistency_->Declare(declare);
  ASSERT_TRUE(created.ok());
  EXPECT_TRUE(created->created());
  EXPECT_TRUE(consistency_->AwaitingRestore());
  // Nobody trains on the initial weights meanwhile.
  EXPECT_EQ(Weight().status().code(), absl::StatusCode::kUnavailable);
  v1::PushResponse resp;
  EXPECT_EQ(consistency_->Push(Grad(1.0f, 0, 0), &resp).code(),
            absl::StatusCode::kUnavailable);
  // A second worker's declare creates nothing and restores nothing.
  auto again = consistency_->Declare(declare);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created());
  v1::AssignRequest restore;
  restore.set_restore(true);
  *restore.add_weights() = testing::SmallModelSlice(3.0f, 250);
  ASSERT_TRUE(consistency_->Assign(restore).ok());
  EXPECT_FALSE(consistency_->AwaitingRestore());
  int64_t version = 0;
  EXPECT_EQ(*Weight(&version), 3.0f);
  EXPECT_EQ(version, 250);
  // Only once: a second copy is refused and changes nothing.
  *restore.mutable_weights(0) = testing::SmallModelSlice(4.0f, 260);
  EXPECT_EQ(consistency_->Assign(restore).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*Weight(), 3.0f);
}

TEST_F(RecoveryTest, NoCopyWithinTheWaitServesTheInitialWeights) {
  Start(Mode::kAsync, /*declare=*/false);
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = testing::SmallModel();
  declare.set_recover(true);
  ASSERT_TRUE(consistency_->Declare(declare).ok());
  EXPECT_EQ(Weight().status().code(), absl::StatusCode::kUnavailable);
  clock_.Advance(absl::Seconds(11));
  EXPECT_EQ(*Weight(), 10.0f);
}

// A model declared from a framework's weights (the client library): no
// one is served the placeholder initializers before the declarer's
// weights have come.
TEST_F(RecoveryTest, DeclaredWeightsAreServedOnlyOnceTheyCame) {
  Start(Mode::kBsp, /*declare=*/false);
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = testing::SmallModel();
  declare.set_weights_follow(true);
  auto created = consistency_->Declare(declare);
  ASSERT_TRUE(created.ok());
  EXPECT_TRUE(created->created());
  EXPECT_EQ(Weight().status().code(), absl::StatusCode::kUnavailable);
  v1::AssignRequest initial;
  initial.set_restore(true);
  *initial.add_weights() = testing::SmallModelSlice(-2.5f, 0);
  ASSERT_TRUE(consistency_->Assign(initial).ok());
  int64_t version = -1;
  EXPECT_EQ(*Weight(&version), -2.5f);
  EXPECT_EQ(version, 0);
  // Declared again (another worker): nothing to wait for, nothing taken.
  auto again = consistency_->Declare(declare);
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->created());
  EXPECT_FALSE(consistency_->AwaitingRestore());
  EXPECT_EQ(consistency_->Assign(initial).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(RecoveryTest, AssignOutsideAllreduceIsRefused) {
  Start(Mode::kAsync);
  v1::AssignRequest assign;
  *assign.add_weights() = testing::SmallModelSlice(-1.0f, 0);
  absl::Status s = consistency_->Assign(assign);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("--mode=allreduce"), std::string::npos) << s;
  EXPECT_EQ(*Weight(), 10.0f);
  assign.set_restore(true);  // Nothing was lost: refused too.
  EXPECT_EQ(consistency_->Assign(assign).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(*Weight(), 10.0f);
}

TEST_F(RecoveryTest, RetriedPushIsAnsweredNotAppliedAgain) {
  Start(Mode::kAsync);
  v1::PushRequest push = Grad(1.0f, 0, kIncarnation);
  push.set_client_id(5);
  push.set_sequence(1);
  v1::PushResponse first, retry;
  ASSERT_TRUE(consistency_->Push(push, &first).ok());
  ASSERT_TRUE(consistency_->Push(push, &retry).ok());
  EXPECT_EQ(retry.versions(0), first.versions(0));
  EXPECT_EQ(*Weight(), 9.0f);
  EXPECT_EQ(store_.Counters()[ShardCounter::kDuplicatePushes], 1);
  push.set_sequence(2);  // The next push of the same client applies.
  ASSERT_TRUE(consistency_->Push(push, &retry).ok());
  push.set_client_id(6);  // So does another client's sequence 1.
  push.set_sequence(1);
  ASSERT_TRUE(consistency_->Push(push, &retry).ok());
  EXPECT_EQ(*Weight(), 7.0f);
}

TEST(PushLedger, WindowBusyTooOldAndFailures) {
  PushLedger ledger;
  v1::PushRequest r;
  r.set_client_id(9);
  v1::PushResponse answer;
  answer.add_versions(42);
  r.set_sequence(1);
  ASSERT_EQ(ledger.Begin(r, &answer), PushLedger::Verdict::kApply);
  // Its retry while it is being applied waits its turn.
  EXPECT_EQ(ledger.Begin(r, &answer), PushLedger::Verdict::kBusy);
  ledger.Finish(r, absl::OkStatus(), answer);
  v1::PushResponse again;
  EXPECT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kAnswered);
  EXPECT_EQ(again.versions(0), 42);
  // A refused push is judged afresh when it comes again.
  r.set_sequence(2);
  ASSERT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kApply);
  ledger.Finish(r, absl::InvalidArgumentError("bad"), again);
  EXPECT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kApply);
  ledger.Finish(r, absl::OkStatus(), again);
  for (int s = 3; s < 3 + PushLedger::kWindow; ++s) {
    r.set_sequence(s);
    ASSERT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kApply);
    ledger.Finish(r, absl::OkStatus(), again);
  }
  r.set_sequence(1);  // Pushed out of the window.
  EXPECT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kTooOld);
  r.set_client_id(0);  // No identity: always applied.
  EXPECT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kApply);
  EXPECT_EQ(ledger.Begin(r, &again), PushLedger::Verdict::kApply);
}

// Regression (issue #38, 9: tools/reliability/chaos.py --mode bsp --workers 4
// --checkpoint_every off, seed 5): a shard restarted without a checkpoint,
// caught up with the job's step, then restored from a worker's copy (its
// steps unknown). Every rank's gradient of the step in progress had gone
// to the dead incarnation, and their pulls that followed those pushes
// were held: the slice could not tell the gradients were missing, so no
// one was asked to push again, and the job stalled until it gave up. Now
// such a pull is answered ABORTED, and the push again completes the step.
TEST_F(RecoveryTest, BspPullAfterPushOnAShardRestoredFromACopyAsksAgain) {
  Start(Mode::kBsp, /*declare=*/false);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RegisterRequest join;
    join.set_rank(rank);
    join.set_num_workers(2);
    join.set_clock(569);
    ASSERT_TRUE(membership_.Register(join).ok());
  }
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = testing::SmallModel();
  declare.set_recover(true);
  ASSERT_TRUE(consistency_->Declare(declare).ok());
  consistency_->Tick();  // Catches up with step 568.
  v1::AssignRequest restore;
  restore.set_restore(true);
  *restore.add_weights() = testing::SmallModelSlice(3.0f, 569);
  ASSERT_TRUE(consistency_->Assign(restore).ok());
  v1::PullRequest req;
  *req.add_slices() = testing::SmallModelKey();
  req.set_rank(0);
  req.set_clock(569);
  req.set_after_push(true);
  v1::PullResponse resp;
  std::optional<absl::Status> answer;
  PendingCall call;
  call.deadline = clock_.Now() + absl::Seconds(30);
  call.done = [&answer](absl::Status s) { answer = s; };
  consistency_->Pull(req, &resp, std::move(call));
  ASSERT_TRUE(answer.has_value()) << "held for a gradient nobody sends";
  EXPECT_EQ(answer->code(), absl::StatusCode::kAborted) << *answer;
  v1::PushResponse pushed;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_TRUE(
        consistency_
            ->Push(Grad(2.0f * (rank + 1), 568, 999, rank, 569), &pushed)
            .ok());
  }
  EXPECT_EQ(*Weight(), 0.0f);  // 3 - (2 + 4) / 2.
}

}  // namespace
}  // namespace asyncps
