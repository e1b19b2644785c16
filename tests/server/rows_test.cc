// The row calls as a shard serves them (server/rows.h), in process: a
// retried push is answered from the ledger and applied once, a refused one
// is judged again, and ReadRows pages through every row held. The fused
// push-pull is Consistency's (consistency_rows_test).
#include "server/rows.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gtest/gtest.h"
#include "tests/server/row_bytes.h"

namespace asyncps {
namespace {

constexpr int kDim = 2;

using testing::Bytes;
using testing::Floats;

class RowsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    v1::EmbeddingSpec spec;
    spec.set_name("t");
    spec.set_dim(kDim);
    spec.mutable_init()->set_kind(v1::Initializer::UNIFORM);
    spec.mutable_init()->set_low(-1.0f);
    spec.mutable_init()->set_high(1.0f);
    spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
    spec.mutable_optimizer()->set_learning_rate(1.0f);
    ASSERT_TRUE(tables_.Declare(spec).ok());
  }

  // One shard of one: every id is this shard's.
  std::vector<float> Pull(const std::vector<int64_t>& ids) {
    v1::PullRowsRequest request;
    request.set_table("t");
    request.set_ids(Bytes(ids));
    v1::PullRowsResponse response;
    EXPECT_TRUE(ServePullRows(&tables_, 0, 1, request, &response).ok());
    return Floats(response.rows());
  }

  v1::PushRowsRequest Push(const std::vector<int64_t>& ids,
                           const std::vector<float>& grads, uint64_t sequence) {
    v1::PushRowsRequest r;
    r.set_table("t");
    r.set_ids(Bytes(ids));
    r.set_grads(Bytes(grads));
    r.set_client_id(42);
    r.set_sequence(sequence);
    return r;
  }

  EmbeddingTables tables_;
};

TEST_F(RowsTest, ARetriedPushIsAnsweredNotAppliedAgain) {
  const std::vector<float> before = Pull({3});
  const v1::PushRowsRequest push = Push({3}, {1.0f, 2.0f}, 1);
  v1::PushRowsResponse first, retry;
  ASSERT_TRUE(ServePushRows(&tables_, 0, 1, push, &first).ok());
  const std::vector<float> after = {before[0] - 1.0f, before[1] - 2.0f};
  ASSERT_TRUE(ServePushRows(&tables_, 0, 1, push, &retry).ok());
  EXPECT_EQ(Pull({3}), after);  // Applied once.
  const v1::EmbeddingStats stats = (*tables_.Find("t"))->Stats();
  EXPECT_EQ(stats.duplicate_pushes(), 1);
  EXPECT_EQ(stats.rows_pushed(), 1);
  EXPECT_GT(stats.bytes_received(), 0);
  EXPECT_GT(stats.bytes_sent(), 0);  // The pulls'.
  // The next push of the same client is new; one without identity applies
  // on every arrival.
  v1::PushRowsResponse r;
  ASSERT_TRUE(ServePushRows(&tables_, 0, 1, Push({3}, {1, 1}, 2), &r).ok());
  v1::PushRowsRequest anonymous = Push({3}, {1, 1}, 0);
  anonymous.set_client_id(0);
  ASSERT_TRUE(ServePushRows(&tables_, 0, 1, anonymous, &r).ok());
  ASSERT_TRUE(ServePushRows(&tables_, 0, 1, anonymous, &r).ok());
  EXPECT_EQ(Pull({3}), (std::vector<float>{after[0] - 3, after[1] - 3}));
}

TEST_F(RowsTest, ARefusedPushChangesNothingAndMayBeSentAgain) {
  const std::vector<float> before = Pull({1, 2});
  v1::PushRowsResponse r;
  // An id of another shard (of two) is refused.
  std::vector<int64_t> theirs;
  for (int64_t id = 0; theirs.empty(); ++id) {
    if (RowShard(id, 2) == 1) theirs.push_back(id);
  }
  const absl::Status refused =
      ServePushRows(&tables_, 0, 2, Push(theirs, {1, 1}, 7), &r);
  EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  // A NaN: refused, and the same request (fixed) is judged again.
  EXPECT_TRUE(absl::IsInvalidArgument(
      ServePushRows(&tables_, 0, 1, Push({1}, {NAN, 0}, 8), &r)));
  EXPECT_EQ(Pull({1, 2}), before);
  ASSERT_TRUE(ServePushRows(&tables_, 0, 1, Push({1}, {1, 0}, 8), &r).ok());
  EXPECT_EQ(Pull({1})[0], before[0] - 1.0f);
}

TEST_F(RowsTest, ReadRowsPagesThroughEveryRowHeld) {
  std::vector<int64_t> ids;
  for (int64_t id = 100; id < 110; ++id) ids.push_back(id);
  v1::PushRowsResponse pushed;
  ASSERT_TRUE(
      ServePushRows(&tables_, 0, 1,
                    Push(ids, std::vector<float>(ids.size() * kDim, 1), 9),
                    &pushed)
          .ok());
  const std::vector<float> rows = Pull(ids);
  absl::flat_hash_set<int64_t> seen;
  v1::ReadRowsRequest request;
  request.set_table("t");
  request.set_max_rows(3);
  int pages = 0;
  for (int64_t start = 0; start >= 0; ++pages) {
    request.set_start(start);
    v1::ReadRowsResponse page;
    ASSERT_TRUE(ServeReadRows(&tables_, request, &page).ok());
    const size_t n = page.ids().size() / sizeof(int64_t);
    std::vector<int64_t> got(n);
    std::memcpy(got.data(), page.ids().data(), page.ids().size());
    const std::vector<float> values = Floats(page.rows());
    ASSERT_EQ(values.size(), n * kDim);
    for (size_t k = 0; k < n; ++k) {
      const size_t at = got[k] - 100;
      EXPECT_EQ(values[k * kDim], rows[at * kDim]);
      EXPECT_TRUE(seen.insert(got[k]).second) << got[k];
    }
    start = page.next();
  }
  EXPECT_EQ(seen.size(), 10u);
  EXPECT_EQ(pages, 4);
  request.set_max_rows(0);
  v1::ReadRowsResponse page;
  EXPECT_TRUE(absl::IsInvalidArgument(ServeReadRows(&tables_, request, &page)));
  request.set_table("nope");
  request.set_max_rows(1);
  EXPECT_TRUE(absl::IsNotFound(ServeReadRows(&tables_, request, &page)));
}

}  // namespace
}  // namespace asyncps
