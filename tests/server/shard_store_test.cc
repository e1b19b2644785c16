// ShardStore in-process: stale policies, the staleness histogram, bsp step
// averaging, late gradients and the step deadline.
#include "server/shard_store.h"

#include <cmath>
#include <string>
#include <thread>
#include <vector>

#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

class ShardStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    spec_ = testing::SmallModel();
    ASSERT_TRUE(store_.Declare(spec_).ok());
  }

  v1::PushRequest Grad(float value, int64_t version, int rank = 0,
                       int64_t clock = 1) {
    return testing::SmallModelPush(value, version, rank, clock);
  }

  float Weight(int64_t* version = nullptr) {
    v1::PullRequest req;
    *req.add_slices() = testing::SmallModelKey();
    v1::PullResponse resp;
    EXPECT_TRUE(store_.Pull(req, &resp).ok());
    std::vector<float> w(4);
    DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
    if (version != nullptr) *version = resp.slices(0).version();
    return w[0];
  }

  v1::ModelSpec spec_;
  ShardStore store_{0, 1, 64 << 20};
};

// A push may carry the hyper-parameters to apply it with (a PyTorch param
// group's, as a scheduler left them): the learning rate here.
TEST_F(ShardStoreTest, PushAppliesItsOwnHyperParameters) {
  v1::PushRequest push = Grad(1.0f, 0);
  *push.mutable_gradients(0)->mutable_optimizer() = spec_.optimizer();
  push.mutable_gradients(0)->mutable_optimizer()->set_learning_rate(0.25f);
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(push, &resp).ok());
  EXPECT_FLOAT_EQ(Weight(), 10.0f - 0.25f);
}

// Another kind than the declared one, or unusable values, are refused by
// name and change no weight.
TEST_F(ShardStoreTest, PushWithBadHyperParametersChangesNothing) {
  v1::PushRequest other = Grad(1.0f, 0);
  other.mutable_gradients(0)->mutable_optimizer()->set_kind(
      v1::OptimizerSpec::ADAM);
  v1::PushResponse resp;
  absl::Status s = store_.Push(other, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("kind ADAM"), std::string::npos) << s;
  v1::PushRequest nan = Grad(1.0f, 0);
  *nan.mutable_gradients(0)->mutable_optimizer() = spec_.optimizer();
  nan.mutable_gradients(0)->mutable_optimizer()->set_learning_rate(NAN);
  s = store_.Push(nan, &resp);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("learning_rate"), std::string::npos) << s;
  int64_t version = -1;
  EXPECT_EQ(Weight(&version), 10.0f);
  EXPECT_EQ(version, 0);
}

// Optimizer state in and out (PyTorch's state_dict through the servers):
// a pull with_state answers the slots; a load_state that does not fit the
// declared optimizer (plain SGD keeps none) is refused and changes nothing.
TEST_F(ShardStoreTest, OptimizerStateComesOutAndMisfitsAreRefused) {
  v1::PushResponse pushed;
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0), &pushed).ok());
  v1::PullRequest pull;
  *pull.add_slices() = testing::SmallModelKey();
  pull.set_with_state(true);
  v1::PullResponse state;
  ASSERT_TRUE(store_.Pull(pull, &state).ok());
  EXPECT_EQ(state.slices(0).optimizer_steps(), 1);
  EXPECT_TRUE(state.slices(0).slot1().empty());  // SGD keeps no slot.
  v1::AssignRequest load;
  load.set_load_state(true);
  v1::SliceData* d = load.add_weights();
  *d->mutable_key() = testing::SmallModelKey();
  EncodeF32(std::vector<float>(4, 1.0f), d->mutable_slot1());
  absl::Status s = store_.LoadState(load);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keeps 0 + 0"), std::string::npos) << s;
  d->set_slot1(std::string(3, 'x'));  // Not whole floats.
  EXPECT_EQ(store_.LoadState(load).code(), absl::StatusCode::kInvalidArgument);
  d->clear_slot1();
  d->set_optimizer_steps(7);
  ASSERT_TRUE(store_.LoadState(load).ok());
  ASSERT_TRUE(store_.Pull(pull, &state).ok());
  EXPECT_EQ(state.slices(0).optimizer_steps(), 7);
  EXPECT_EQ(Weight(), 9.0f);  // The weights stay.
}

// A buffer tensor (BatchNorm's statistics) is averaged, not trained:
// async moves it 1/live-workers of the way to a pushed value, bsp sets it
// to the mean of the step's values.
TEST(ShardStoreBufferTest, BuffersAverageThePushedValues) {
  v1::ModelSpec spec = testing::SmallModel();
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::MOMENTUM);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.mutable_tensors(0)->set_buffer(true);
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(spec).ok());
  auto weight = [&store] {
    v1::PullRequest req;
    *req.add_slices() = testing::SmallModelKey();
    v1::PullResponse resp;
    EXPECT_TRUE(store.Pull(req, &resp).ok());
    std::vector<float> w(4);
    DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
    return w[0];
  };
  PushPolicy two;
  two.live_workers = 2;
  v1::PushResponse resp;
  ASSERT_TRUE(store.Push(testing::SmallModelPush(4.0f), two, &resp).ok());
  EXPECT_FLOAT_EQ(weight(), 7.0f);  // 10 + (4 - 10) / 2.
  PushPolicy bsp;
  bsp.mode = Mode::kBsp;
  bsp.quorum = 2;
  bsp.live_workers = 2;
  ASSERT_TRUE(
      store.Push(testing::SmallModelPush(2.0f, 1, 0, 1), bsp, &resp).ok());
  ASSERT_TRUE(
      store.Push(testing::SmallModelPush(4.0f, 1, 1, 1), bsp, &resp).ok());
  EXPECT_FLOAT_EQ(weight(), 3.0f);  // The mean of the step's values.
  v1::PullRequest with_state;
  *with_state.add_slices() = testing::SmallModelKey();
  with_state.set_with_state(true);
  v1::PullResponse state;
  ASSERT_TRUE(store.Pull(with_state, &state).ok());
  EXPECT_TRUE(state.slices(0).slot1().empty());  // No momentum kept.
}

TEST_F(ShardStoreTest, DropPolicySkipsStaleGradients) {
  PushPolicy policy;
  policy.stale.kind = StalePolicy::kDrop;
  policy.stale.max_staleness = 0;
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0), policy, &resp).ok());
  EXPECT_FALSE(resp.dropped(0));
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0), policy, &resp).ok());  // Stale: 1.
  EXPECT_TRUE(resp.dropped(0));
  EXPECT_EQ(resp.staleness(0), 1);
  int64_t version;
  EXPECT_EQ(Weight(&version), 9.0f);
  EXPECT_EQ(version, 1);
  EXPECT_EQ(store_.Counters()[ShardCounter::kDroppedStale], 1);
}

TEST_F(ShardStoreTest, ScalePolicyDividesTheStepByOnePlusStaleness) {
  PushPolicy policy;
  policy.stale.kind = StalePolicy::kScale;
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0), policy, &resp).ok());  // 10 - 1
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0), policy, &resp).ok());  // - 1/2
  ASSERT_TRUE(store_.Push(Grad(3.0f, 0), policy, &resp).ok());  // - 3/3
  EXPECT_FLOAT_EQ(Weight(), 7.5f);
  std::vector<int64_t> h = store_.Counters().staleness_histogram;
  EXPECT_EQ(h[0], 1);
  EXPECT_EQ(h[1], 1);
  EXPECT_EQ(h[2], 1);
}

TEST_F(ShardStoreTest, BspAppliesTheMeanOnceTheQuorumIsIn) {
  PushPolicy policy;
  policy.mode = Mode::kBsp;
  policy.quorum = 2;
  policy.live_workers = 2;
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0, 0, 1), policy, &resp).ok());
  EXPECT_EQ(Weight(), 10.0f);  // Waiting for rank 1.
  EXPECT_FALSE(store_.StepApplied({0}, 1));
  // The same rank again for the same step does not count twice.
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0, 0, 1), policy, &resp).ok());
  EXPECT_TRUE(resp.dropped(0));
  EXPECT_EQ(Weight(), 10.0f);
  ASSERT_TRUE(store_.Push(Grad(3.0f, 0, 1, 1), policy, &resp).ok());
  int64_t version;
  EXPECT_EQ(Weight(&version), 8.0f);  // 10 - mean(1, 3).
  EXPECT_EQ(version, 1);
  EXPECT_TRUE(store_.StepApplied({0}, 1));
  // A step ahead of the next one is refused and changes nothing.
  absl::Status ahead = store_.Push(Grad(1.0f, 1, 0, 3), policy, &resp);
  EXPECT_EQ(ahead.code(), absl::StatusCode::kFailedPrecondition) << ahead;
  EXPECT_EQ(Weight(), 8.0f);
  // A push without a rank cannot take part in a step.
  EXPECT_EQ(store_.Push(Grad(1.0f, 1, -1, 2), policy, &resp).code(),
            absl::StatusCode::kInvalidArgument);
  // A gradient for step 1, now applied, is late.
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0, 2, 1), policy, &resp).ok());
  EXPECT_TRUE(resp.dropped(0));
  ShardCounters c = store_.Counters();
  EXPECT_EQ(c[ShardCounter::kDroppedLate], 2);
  EXPECT_EQ(c[ShardCounter::kStepsApplied], 1);
  EXPECT_EQ(c[ShardCounter::kStepsShort], 0);
}

// Issue #38, 2: a rank's empty share (SliceData.no_gradient) counts for the
// quorum and adds zero; the mean is over every rank of the step; a step no
// rank sent a gradient for moves nothing; the tick's fast-forward never
// skips the job's own step with gradients in (it lost them silently), and
// applies a stale one before it short.
TEST_F(ShardStoreTest, BspAMissingGradientCountsAsZero) {
  PushPolicy policy;
  policy.mode = Mode::kBsp;
  policy.quorum = 2;
  policy.live_workers = 2;
  v1::PushResponse resp;
  auto none = [](int rank, int64_t clock) {
    v1::PushRequest r = testing::SmallModelPush(0.0f, 0, rank, clock);
    r.mutable_gradients(0)->clear_data();
    r.mutable_gradients(0)->set_no_gradient(true);
    return r;
  };
  ASSERT_TRUE(store_.Push(Grad(4.0f, 0, 0, 1), policy, &resp).ok());
  // A worker that reported clock 2 elsewhere: step 1 here still waits.
  EXPECT_EQ(store_.FastForwardTo(1, /*quorum=*/2), 0);
  EXPECT_FALSE(store_.StepApplied({0}, 1));
  ASSERT_TRUE(store_.Push(none(1, 1), policy, &resp).ok());
  EXPECT_EQ(Weight(), 8.0f);  // 10 - (4 + 0) / 2.
  // A step before the one the job completed will not be completed by its
  // ranks (its missing shares were lost with a restart, or their rank
  // went on without it): the fast-forward applies it with what it has,
  // the quorum's missing ranks counting as zero, counted as short, and moves
  // past it. It never drops a gradient it was sent
  // (tools/reliability/history_check.py found acknowledged pushes lost so).
  ASSERT_TRUE(store_.Push(Grad(2.0f, 1, 0, 2), policy, &resp).ok());
  EXPECT_EQ(store_.FastForwardTo(2, 2), 0);  // Step 2 itself may come.
  EXPECT_EQ(Weight(), 8.0f);
  const int64_t short_before = store_.Counters()[ShardCounter::kStepsShort];
  EXPECT_EQ(store_.FastForwardTo(3, 2), 1);
  EXPECT_TRUE(store_.StepApplied({0}, 3));
  EXPECT_EQ(Weight(), 7.0f);  // Rank 0's 2 and rank 1's lost share 0, / 2.
  EXPECT_EQ(store_.Counters()[ShardCounter::kStepsShort], short_before + 1);
  ASSERT_TRUE(store_.Push(none(0, 4), policy, &resp).ok());
  ASSERT_TRUE(store_.Push(none(1, 4), policy, &resp).ok());
  EXPECT_EQ(Weight(), 7.0f);  // Nobody sent one: nothing moves.
  EXPECT_TRUE(store_.StepApplied({0}, 4));
  // Data with no_gradient, or no_gradient outside bsp: refused.
  v1::PushRequest both = Grad(1.0f, 0, 0, 5);
  both.mutable_gradients(0)->set_no_gradient(true);
  EXPECT_TRUE(absl::IsInvalidArgument(store_.Push(both, policy, &resp)));
  EXPECT_TRUE(absl::IsInvalidArgument(store_.Push(none(0, 5), &resp)));
  EXPECT_EQ(Weight(), 7.0f);
  // With one rank left (the other died), the stale step is its gradient.
  policy.quorum = 1;
  ASSERT_TRUE(store_.Push(Grad(2.0f, 2, 0, 5), policy, &resp).ok());
  policy.quorum = 2;
  ASSERT_TRUE(store_.Push(Grad(2.0f, 3, 0, 6), policy, &resp).ok());
  EXPECT_EQ(Weight(), 5.0f);
  EXPECT_EQ(store_.FastForwardTo(7, 1), 1);
  EXPECT_EQ(Weight(), 3.0f);
}

// A push for the step after the pending one says its rank is done with
// the pending step: its share there was lost (a shard restarted since it
// was sent; chaos found workers refused "step 230 ... before step 229 was
// applied" and dying), so it counts as zero, if that completes the step;
// while other ranks are still missing the push is UNAVAILABLE (ask again).
TEST_F(ShardStoreTest, BspAPushOfTheNextStepCompletesTheStepItLeft) {
  PushPolicy policy;
  policy.mode = Mode::kBsp;
  policy.quorum = 3;
  policy.live_workers = 3;
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(6.0f, 0, 0, 1), policy, &resp).ok());
  const absl::Status early = store_.Push(Grad(3.0f, 0, 1, 2), policy, &resp);
  EXPECT_TRUE(absl::IsUnavailable(early)) << early;
  EXPECT_EQ(Weight(), 10.0f);
  ASSERT_TRUE(store_.Push(Grad(3.0f, 0, 2, 1), policy, &resp).ok());
  ASSERT_TRUE(store_.Push(Grad(3.0f, 0, 1, 2), policy, &resp).ok());
  EXPECT_EQ(Weight(), 7.0f);  // 10 - (6 + 3 + 0) / 3.
  EXPECT_TRUE(store_.StepApplied({0}, 1));
  EXPECT_FALSE(store_.StepApplied({0}, 2));  // Rank 1's 3 waits in step 2.
  for (int rank : {0, 2}) {
    ASSERT_TRUE(store_.Push(Grad(3.0f, 1, rank, 2), policy, &resp).ok());
  }
  EXPECT_EQ(Weight(), 4.0f);
  // Further ahead than that: refused, as before.
  EXPECT_TRUE(absl::IsFailedPrecondition(
      store_.Push(Grad(1.0f, 2, 0, 4), policy, &resp)));
}

TEST_F(ShardStoreTest, BspDeadlineAppliesAShortStep) {
  PushPolicy policy;
  policy.mode = Mode::kBsp;
  policy.quorum = 3;
  policy.live_workers = 3;
  policy.now = absl::UnixEpoch();
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(2.0f, 0, 0, 1), policy, &resp).ok());
  EXPECT_EQ(store_.CompletePendingSteps(3, 3, absl::Seconds(5),
                                        absl::UnixEpoch() + absl::Seconds(4)),
            0);
  EXPECT_EQ(store_.CompletePendingSteps(3, 3, absl::Seconds(5),
                                        absl::UnixEpoch() + absl::Seconds(5)),
            1);
  EXPECT_EQ(Weight(), 8.0f);
  EXPECT_EQ(store_.Counters()[ShardCounter::kStepsShort], 1);
}

TEST_F(ShardStoreTest, BspQuorumShrinksWhenAWorkerDies) {
  PushPolicy policy;
  policy.mode = Mode::kBsp;
  policy.quorum = 2;
  policy.live_workers = 2;
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(2.0f, 0, 0, 1), policy, &resp).ok());
  EXPECT_EQ(store_.CompletePendingSteps(1, 1, absl::ZeroDuration(),
                                        absl::UnixEpoch()),
            1);
  EXPECT_EQ(Weight(), 8.0f);
}

// A replica's snapshot carries bsp's step in progress: a store restored
// from it completes the step with the next rank's gradient as the original
// does, and one restored from a checkpoint file's form has no such step.
TEST_F(ShardStoreTest, ReplicaSnapshotCarriesTheStepInProgress) {
  PushPolicy policy;
  policy.mode = Mode::kBsp;
  policy.quorum = 2;
  policy.live_workers = 2;
  policy.now = absl::UnixEpoch() + absl::Seconds(7);
  v1::PushResponse resp;
  ASSERT_TRUE(store_.Push(Grad(1.0f, 0, 0, 1), policy, &resp).ok());
  auto with_step = store_.Snapshot(/*pending=*/true);
  auto file_form = store_.Snapshot();
  ASSERT_TRUE(with_step.ok() && file_form.ok());
  EXPECT_EQ(with_step->slices(0).step_ranks_size(), 1);
  EXPECT_EQ(file_form->slices(0).step_ranks_size(), 0);
  ShardStore copy(0, 1, 64 << 20);
  ASSERT_TRUE(copy.Restore(*with_step).ok());
  // The step's first gradient came at the original's time: a deadline
  // counts from it on the copy too.
  EXPECT_EQ(copy.CompletePendingSteps(2, 2, absl::Seconds(5),
                                      absl::UnixEpoch() + absl::Seconds(11)),
            0);
  ASSERT_TRUE(store_.Push(Grad(3.0f, 0, 1, 1), policy, &resp).ok());
  ASSERT_TRUE(copy.Push(Grad(3.0f, 0, 1, 1), policy, &resp).ok());
  EXPECT_TRUE(copy.StepApplied({0}, 1));
  auto a = store_.Snapshot(true);
  auto b = copy.Snapshot(true);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->slices(0).SerializeAsString(), b->slices(0).SerializeAsString());
  // A snapshot with a step sum of the wrong size is refused whole.
  v1::ShardCheckpoint bad = *with_step;
  bad.mutable_slices(0)->mutable_step_sum()->resize(4);
  ShardStore refused(0, 1, 64 << 20);
  EXPECT_EQ(refused.Restore(bad).code(), absl::StatusCode::kDataLoss);
}

// A joining backup's copy is taken on write (issue #40, a join without a
// pause): after SnapshotLazily the slices a push changes first save
// themselves, the rest are saved by Finish, concurrently with more pushes;
// either way the copy is the state at the mark. A copy dropped unfinished
// leaves no slice writing into it.
TEST(ShardStoreLazyCopyTest, TheCopyIsTheStateAtItsMark) {
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(testing::ChunkyModel()).ok());
  v1::PushResponse resp;
  ASSERT_TRUE(store.Push(testing::ChunkyModelPush(0.5f), &resp).ok());
  auto at_mark = store.Snapshot(/*pending=*/true);
  ASSERT_TRUE(at_mark.ok()) << at_mark.status();
  v1::ShardCheckpoint head;
  std::vector<v1::SliceCheckpoint> slices;
  auto copy =
      store.SnapshotLazily(true, at_mark->unix_micros(), &head, &slices);
  ASSERT_TRUE(copy.ok()) << copy.status();
  v1::PushRequest two = testing::ChunkyModelPush(1.5f);
  two.mutable_gradients()->DeleteSubrange(1, 1);  // Slices 0 and 2.
  ASSERT_TRUE(store.Push(two, &resp).ok());
  std::thread more([&] {
    for (int i = 0; i < 50; ++i) {
      EXPECT_TRUE(store.Push(testing::ChunkyModelPush(0.25f), &resp).ok());
    }
  });
  (*copy)->Finish();
  more.join();
  auto after = store.Snapshot(true);
  ASSERT_TRUE(after.ok());
  ASSERT_EQ(slices.size(), 3u);
  EXPECT_EQ(head.spec().SerializeAsString(),
            at_mark->spec().SerializeAsString());
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(slices[k].SerializeAsString(),
              at_mark->slices(k).SerializeAsString())
        << "slice " << k;
    EXPECT_NE(after->slices(k).weights(), at_mark->slices(k).weights());
  }
  // Dropped before Finish: the next push writes into nothing (ASAN).
  auto dropped = store.SnapshotLazily(true, 0, &head, &slices);
  ASSERT_TRUE(dropped.ok());
  dropped->reset();
  slices.clear();
  ASSERT_TRUE(store.Push(testing::ChunkyModelPush(1.0f), &resp).ok());
}

TEST_F(ShardStoreTest, AssignReplacesWeightsAndVersion) {
  v1::AssignRequest req;
  v1::SliceData* d = req.add_weights();
  d->mutable_key()->set_tensor("w");
  d->mutable_key()->set_count(4);
  d->set_dtype(v1::DTYPE_F32);
  d->set_version(42);
  std::vector<float> w = {1, 2, 3, 4};
  EncodeF32(w, d->mutable_data());
  ASSERT_TRUE(store_.Assign(req).ok());
  int64_t version;
  EXPECT_EQ(Weight(&version), 1.0f);
  EXPECT_EQ(version, 42);
  w[2] = std::numeric_limits<float>::quiet_NaN();
  EncodeF32(w, d->mutable_data());
  EXPECT_EQ(store_.Assign(req).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Weight(), 1.0f);
}

}  // namespace
}  // namespace asyncps
