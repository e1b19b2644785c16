// Consistency for embedding rows in-process with a manual clock
// (server/consistency_rows.cc): async answers at once and the fused
// push-pull reads after its push (a retry applied once); bsp adds a
// step's pushes up and applies their mean once every rank pushed (empty
// pushes count), holds a pull until its step is applied, drops a second
// push of a rank and refuses one from a step ahead with nothing changed,
// applies a short step at --step_deadline and heals one whose missing
// ranks all wait or said they completed it; ssp holds a row pull as a dense
// one; shutdown answers held row pulls.
#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/consistency.h"
#include "tests/server/row_bytes.h"

namespace asyncps {
namespace {

constexpr int kDim = 2;

using testing::Bytes;
using testing::Floats;

// A call's answer, and where its rows went.
struct Answered {
  std::optional<absl::Status> status;
  std::string rows;
  std::vector<float> Rows() const { return Floats(rows); }
};

class ConsistencyRowsTest : public ::testing::Test {
 protected:
  // A table of rows starting at 10 (SGD, learning rate 1: a gradient g
  // moves a row by exactly -g), on shard 0 of 1.
  void Start(ConsistencyConfig config, int workers) {
    consistency_.emplace(config, &store_, &membership_, &clock_, &tables_, 1);
    v1::EmbeddingSpec spec;
    spec.set_name("t");
    spec.set_dim(kDim);
    spec.mutable_init()->set_kind(v1::Initializer::CONSTANT);
    spec.mutable_init()->set_value(10.0f);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_learning_rate(1.0f);
    ASSERT_TRUE(tables_.Declare(spec).ok());
    for (int r = 0; r < workers; ++r) {
      v1::RegisterRequest join;
      join.set_rank(r);
      join.set_num_workers(workers);
      ASSERT_TRUE(membership_.Register(join).ok());
    }
  }

  PendingCall Call(Answered* a, absl::Duration timeout = absl::Seconds(60)) {
    PendingCall call;
    call.deadline = clock_.Now() + timeout;
    call.done = [a](absl::Status s) {
      ASSERT_FALSE(a->status.has_value()) << "answered twice";
      a->status = s;
    };
    return call;
  }

  // Pulls `ids` as `rank` at `clock`; the request lives in the fixture.
  void Pull(Answered* a, int rank, int64_t clock,
            const std::vector<int64_t>& ids,
            absl::Duration timeout = absl::Seconds(60)) {
    auto& request = pulls_.emplace_back();
    request.set_table("t");
    request.set_ids(Bytes(ids));
    request.set_rank(rank);
    request.set_clock(clock);
    membership_.Touch(rank, clock);
    auto& response = pull_answers_.emplace_back();
    Answered* const out = a;
    PendingCall call = Call(a, timeout);
    call.done = [out, &response, done = call.done](absl::Status s) {
      out->rows = response.rows();
      done(s);
    };
    consistency_->PullRows(request, &response, std::move(call));
  }

  v1::PushRowsRequest PushRequest(int rank, int64_t clock,
                                  const std::vector<int64_t>& ids,
                                  const std::vector<float>& grads,
                                  uint64_t sequence) {
    v1::PushRowsRequest r;
    r.set_table("t");
    r.set_ids(Bytes(ids));
    r.set_grads(Bytes(grads));
    r.set_rank(rank);
    r.set_clock(clock);
    r.set_client_id(100 + static_cast<uint64_t>(rank));
    r.set_sequence(sequence);
    return r;
  }

  // Pushes (and, if the request says so, pulls) and keeps the call.
  void PushRows(Answered* a, const v1::PushRowsRequest& request) {
    auto& kept = pushes_.emplace_back(request);
    auto& response = push_answers_.emplace_back();
    membership_.Touch(request.rank(), request.clock());
    PendingCall call = Call(a);
    call.done = [a, &response, done = call.done](absl::Status s) {
      a->rows = response.rows();
      done(s);
    };
    consistency_->PushRows(kept, &response, std::move(call));
  }

  absl::Status Push(int rank, int64_t clock, const std::vector<int64_t>& ids,
                    const std::vector<float>& grads) {
    Answered a;
    PushRows(&a, PushRequest(rank, clock, ids, grads, ++sequence_));
    EXPECT_TRUE(a.status.has_value()) << "a plain push is never held";
    return a.status.value_or(absl::InternalError("held"));
  }

  // The rows as a reader sees them (never held).
  std::vector<float> Read(const std::vector<int64_t>& ids) {
    Answered a;
    Pull(&a, -1, 0, ids);
    EXPECT_TRUE(a.status.has_value() && a.status->ok());
    return a.Rows();
  }

  ManualClock clock_;
  ShardStore store_{0, 1, 64 << 20};
  Membership membership_{&clock_, absl::Seconds(5)};
  EmbeddingTables tables_;
  std::optional<Consistency> consistency_;
  uint64_t sequence_ = 0;
  // Requests and answers of calls that may be held: stable addresses.
  std::deque<v1::PullRowsRequest> pulls_;
  std::deque<v1::PullRowsResponse> pull_answers_;
  std::deque<v1::PushRowsRequest> pushes_;
  std::deque<v1::PushRowsResponse> push_answers_;
};

TEST_F(ConsistencyRowsTest, AsyncFusedPushPullReadsAfterItsPushOnce) {
  Start(ConsistencyConfig(), 2);
  v1::PushRowsRequest r = PushRequest(0, 1, {3, 3}, {1, 2, 1, 2}, 1);
  r.set_pull_ids(Bytes(std::vector<int64_t>{3, 4}));
  Answered first, retry;
  PushRows(&first, r);
  ASSERT_TRUE(first.status.has_value() && first.status->ok());
  // Repeated ids summed; the pull reads after the push.
  EXPECT_EQ(first.Rows(), (std::vector<float>{8, 6, 10, 10}));
  PushRows(&retry, r);  // A retry: answered, not applied again.
  ASSERT_TRUE(retry.status.has_value() && retry.status->ok());
  EXPECT_EQ(retry.Rows(), first.Rows());
  EXPECT_EQ(Read({3}), (std::vector<float>{8, 6}));
  EXPECT_EQ((*tables_.Find("t"))->Stats().duplicate_pushes(), 1);
  // A malformed pull half is refused before anything is pushed.
  v1::PushRowsRequest bad = PushRequest(0, 2, {3}, {1, 1}, 2);
  bad.set_pull_ids("12345");  // Not a whole number of int64s.
  Answered refused;
  PushRows(&refused, bad);
  ASSERT_TRUE(refused.status.has_value());
  EXPECT_TRUE(absl::IsInvalidArgument(*refused.status)) << *refused.status;
  EXPECT_EQ(Read({3}), (std::vector<float>{8, 6}));
}

TEST_F(ConsistencyRowsTest, BspAppliesTheMeanOfAStepOnceEveryRankPushed) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, {1, 2}, {2, 2, 4, 4}).ok());
  EXPECT_EQ(Read({1, 2}), (std::vector<float>{10, 10, 10, 10}));
  Answered held;
  Pull(&held, 0, 1, {1, 2, 5});
  EXPECT_FALSE(held.status.has_value());  // Step 1 waits for rank 1.
  // A second push of rank 0 for the step adds to its share (it was
  // dropped: issue #38, 3), and does not count towards the quorum.
  ASSERT_TRUE(Push(0, 1, {1}, {100, 100}).ok());
  EXPECT_FALSE(held.status.has_value());
  // Rank 1 touches row 1 and row 5; its push completes the step.
  ASSERT_TRUE(Push(1, 1, {1, 5}, {6, 6, 8, 8}).ok());
  ASSERT_TRUE(held.status.has_value());
  ASSERT_TRUE(held.status->ok());
  // Each row's sum over the two ranks, halved: row 1 (2 + 100 + 6) / 2,
  // row 2 4 / 2, row 5 8 / 2.
  EXPECT_EQ(held.Rows(), (std::vector<float>{-44, -44, 8, 8, 6, 6}));
  // Step 2: rank 1 has no rows here; its empty push still counts.
  ASSERT_TRUE(Push(0, 2, {2}, {2, 2}).ok());
  EXPECT_EQ(Read({2}), (std::vector<float>{8, 8}));
  ASSERT_TRUE(Push(1, 2, {}, {}).ok());
  EXPECT_EQ(Read({2}), (std::vector<float>{7, 7}));
  EXPECT_EQ((*tables_.Find("t"))->applied_step(), 2);
}

TEST_F(ConsistencyRowsTest, BspRefusesAPushFromAStepAheadAndChangesNothing) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, {1}, {2, 2}).ok());
  const absl::Status ahead = Push(0, 3, {1}, {2, 2});
  EXPECT_TRUE(absl::IsFailedPrecondition(ahead)) << ahead;
  EXPECT_NE(ahead.message().find("before step 1 was applied"),
            std::string::npos)
      << ahead;
  // NaN and a wrong width: refused, nothing added to the step.
  EXPECT_TRUE(absl::IsInvalidArgument(Push(1, 1, {1}, {NAN, 0})));
  EXPECT_TRUE(absl::IsInvalidArgument(Push(1, 1, {1}, {1, 1, 1})));
  ASSERT_TRUE(Push(1, 1, {1}, {4, 4}).ok());
  EXPECT_EQ(Read({1}), (std::vector<float>{7, 7}));
}

TEST_F(ConsistencyRowsTest, BspFusedPushPullWaitsForTheStepEvenWithNoIds) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  v1::PushRowsRequest r = PushRequest(0, 1, {1}, {2, 2}, 1);
  r.set_fused(true);  // Nothing to pull here: the answer still waits.
  Answered fused;
  PushRows(&fused, r);
  EXPECT_FALSE(fused.status.has_value());
  ASSERT_TRUE(Push(1, 1, {}, {}).ok());
  ASSERT_TRUE(fused.status.has_value());
  EXPECT_TRUE(fused.status->ok());
  EXPECT_TRUE(fused.rows.empty());
  EXPECT_EQ(Read({1}), (std::vector<float>{9, 9}));
}

TEST_F(ConsistencyRowsTest, BspStepDeadlineAppliesAShortStep) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.step_deadline = absl::Seconds(1);
  config.heal_after = absl::ZeroDuration();
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, {1}, {2, 2}).ok());
  Answered p;
  Pull(&p, 0, 1, {1});
  consistency_->Tick();
  EXPECT_FALSE(p.status.has_value());
  clock_.Advance(absl::Seconds(1.5));
  consistency_->Tick();
  ASSERT_TRUE(p.status.has_value() && p.status->ok());
  EXPECT_EQ(p.Rows(), (std::vector<float>{8, 8}));  // Rank 0's alone.
  // Rank 1's late push for the applied step is dropped.
  ASSERT_TRUE(Push(1, 1, {1}, {4, 4}).ok());
  EXPECT_EQ(Read({1}), (std::vector<float>{8, 8}));
}

TEST_F(ConsistencyRowsTest, BspHealsAStepWhoseMissingRankWaits) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.heal_after = absl::Seconds(3);
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, {1}, {2, 2}).ok());
  Answered pusher;
  Pull(&pusher, 0, 1, {1});
  // Rank 1 computes (nothing held): the step waits past the bound.
  for (int s = 0; s < 5; ++s) {
    clock_.Advance(absl::Seconds(1));
    membership_.Touch(0, 1);
    membership_.Touch(1, 0);
    consistency_->Tick();
  }
  EXPECT_FALSE(pusher.status.has_value());
  // Rank 1 now waits for step 1 without having pushed it (lost with a
  // restart): the step goes without it.
  Answered blocked;
  Pull(&blocked, 1, 1, {1});
  EXPECT_FALSE(blocked.status.has_value());
  consistency_->Tick();
  ASSERT_TRUE(pusher.status.has_value() && pusher.status->ok());
  ASSERT_TRUE(blocked.status.has_value() && blocked.status->ok());
  EXPECT_EQ(blocked.Rows(), (std::vector<float>{8, 8}));
}

// Rows as dense slices (issue #38, seed 19): a rank that says it completed
// a step (here its registration, resuming past it) will not send its share
// of it; after --heal_after the step goes without it.
TEST_F(ConsistencyRowsTest, BspHealsAStepWhoseMissingRankCompletedIt) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  config.heal_after = absl::Seconds(3);
  Start(config, 0);
  for (int rank = 0; rank < 2; ++rank) {
    v1::RegisterRequest join;
    join.set_rank(rank);
    join.set_num_workers(2);
    join.set_clock(rank);  // Rank 1 completed step 1 before this restart.
    ASSERT_TRUE(membership_.Register(join).ok());
  }
  ASSERT_TRUE(Push(0, 1, {1}, {2, 2}).ok());
  Answered pusher;
  Pull(&pusher, 0, 1, {1});
  for (int s = 0; s < 3; ++s) {
    EXPECT_FALSE(pusher.status.has_value()) << "healed before the bound";
    clock_.Advance(absl::Seconds(1));
    membership_.Touch(0, 1);
    membership_.Touch(1, 1);
    consistency_->Tick();
  }
  ASSERT_TRUE(pusher.status.has_value() && pusher.status->ok());
  EXPECT_EQ(pusher.Rows(), (std::vector<float>{8, 8}));  // Rank 0's alone.
}

TEST_F(ConsistencyRowsTest, SspHoldsARowPullUntilTheSlowestIsClose) {
  ConsistencyConfig config;
  config.mode = Mode::kSsp;
  config.staleness = 1;
  Start(config, 2);
  membership_.Touch(1, 0);
  Answered near, far;
  Pull(&near, 0, 1, {1});
  ASSERT_TRUE(near.status.has_value() && near.status->ok());
  Pull(&far, 0, 2, {1});
  EXPECT_FALSE(far.status.has_value());
  // Pushes apply on arrival in ssp.
  ASSERT_TRUE(Push(1, 1, {1}, {1, 1}).ok());
  membership_.Touch(1, 1);
  consistency_->Tick();
  ASSERT_TRUE(far.status.has_value() && far.status->ok());
  EXPECT_EQ(far.Rows(), (std::vector<float>{9, 9}));
}

TEST_F(ConsistencyRowsTest, HeldRowPullsExpireAndShutdownAnswersThem) {
  ConsistencyConfig config;
  config.mode = Mode::kBsp;
  Start(config, 2);
  ASSERT_TRUE(Push(0, 1, {1}, {2, 2}).ok());
  Answered expiring, held;
  Pull(&expiring, 0, 1, {1}, absl::Seconds(1));
  Pull(&held, 0, 1, {1});
  clock_.Advance(absl::Seconds(2));
  consistency_->Tick();
  ASSERT_TRUE(expiring.status.has_value());
  EXPECT_TRUE(absl::IsDeadlineExceeded(*expiring.status));
  EXPECT_FALSE(held.status.has_value());
  // A pull of a table not declared here is answered at once.
  pulls_.emplace_back().set_table("nope");
  Answered unknown;
  consistency_->PullRows(pulls_.back(), &pull_answers_.emplace_back(),
                         Call(&unknown));
  ASSERT_TRUE(unknown.status.has_value());
  EXPECT_TRUE(absl::IsNotFound(*unknown.status)) << *unknown.status;
  consistency_->Shutdown();
  ASSERT_TRUE(held.status.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*held.status));
}

}  // namespace
}  // namespace asyncps
