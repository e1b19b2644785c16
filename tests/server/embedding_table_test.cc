// EmbeddingTable (server/embedding_table.h) against references written out
// here: SGD and AdaGrad on summed duplicate ids, lazy Adam's per-row steps,
// rows made the same on every table, least-recently-used eviction, ids
// spread evenly over shards (Zipf too), and every bad request refused with
// no row moved.
#include "server/embedding_table.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/server/embedding_table_fixture.h"

namespace asyncps {
namespace {

TEST(EmbeddingTable, PullAnswersInTheCallersOrderWithRepeats) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::SGD));
  const std::vector<float> a = Rows(&t, {5, 9, 5, -3});
  EXPECT_EQ(Row(a, 0), Row(a, 2));
  EXPECT_NE(Row(a, 0), Row(a, 1));
  EXPECT_EQ(t.rows(), 0) << "a pull stored rows";
  const std::vector<float> b = Rows(&t, {-3, 9});  // Even a negative id.
  EXPECT_EQ(Row(b, 0), Row(a, 3));
  EXPECT_EQ(Row(b, 1), Row(a, 1));
  for (float v : a) EXPECT_TRUE(v >= -0.5f && v < 0.5f) << v;
}

TEST(EmbeddingTable, ARowIsTheSameOnEveryTable) {
  // Another shard, or this one after a restart, makes the same rows.
  EmbeddingTable one(Spec(v1::OptimizerSpec::SGD));
  EmbeddingTable two(Spec(v1::OptimizerSpec::SGD));
  Rows(&two, {1, 2, 3});
  EXPECT_EQ(Rows(&one, {int64_t{1} << 62, 3}),
            Rows(&two, {int64_t{1} << 62, 3}));
}

TEST(EmbeddingTable, SgdSumsRepeatedIdsIntoOneUpdate) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::SGD));
  const std::vector<float> before = Rows(&t, {1, 2, 3});
  const std::vector<int64_t> ids = {2, 1, 2};
  const std::vector<float> g = {1,    2,    3,  4, 0.5f, 0.5f,
                                0.5f, 0.5f, -1, 1, -1,   1};
  ASSERT_TRUE(t.Push(ids, g).ok());
  const std::vector<float> after = Rows(&t, {1, 2, 3});
  for (int j = 0; j < 4; ++j) {
    EXPECT_FLOAT_EQ(after[j], before[j] - 0.1f * 0.5f);  // Row 1.
    EXPECT_FLOAT_EQ(after[4 + j], before[4 + j] - 0.1f * (g[j] + g[8 + j]));
    EXPECT_EQ(after[8 + j], before[8 + j]);  // Row 3: not pushed.
  }
  EXPECT_EQ(t.steps(2), 1) << "repeats are one update";
  EXPECT_EQ(t.steps(3), 0);
}

TEST(EmbeddingTable, AdagradKeepsAnAccumulatorPerRow) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::ADAGRAD));
  std::vector<float> w = Rows(&t, {4});
  std::vector<double> acc(4, 0.1);
  for (int round = 0; round < 3; ++round) {
    const std::vector<float> g = {0.3f * round + 0.1f, -0.2f, 1.0f, 0.0f};
    ASSERT_TRUE(t.Push({4}, g).ok());
    for (int j = 0; j < 4; ++j) {
      acc[j] += double{g[j]} * g[j];
      w[j] -= static_cast<float>(0.1 * g[j] / (std::sqrt(acc[j]) + 1e-8));
    }
  }
  const std::vector<float> got = Rows(&t, {4});
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(got[j], w[j], 1e-6) << j;
}

TEST(EmbeddingTable, AdamIsLazyEachRowCountsItsOwnSteps) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::ADAM));
  const std::vector<float> before = Rows(&t, {1, 2, 3});
  const std::vector<float> g = {0.5f, -0.5f, 0.25f, 1.0f};
  ASSERT_TRUE(t.Push({1}, g).ok());
  ASSERT_TRUE(
      t.Push({1, 2}, {g[0], g[1], g[2], g[3], g[0], g[1], g[2], g[3]}).ok());
  EXPECT_EQ(t.steps(1), 2);
  EXPECT_EQ(t.steps(2), 1);
  EXPECT_EQ(t.steps(3), 0);
  const std::vector<float> after = Rows(&t, {1, 2, 3});
  // Adam with bias correction, row by row from its own step count.
  auto adam = [&](float w0, float gj, int steps) {
    double m = 0, v = 0, w = w0;
    for (int s = 1; s <= steps; ++s) {
      m = 0.9 * m + 0.1 * gj;
      v = 0.999 * v + 0.001 * gj * gj;
      const double mhat = m / (1 - std::pow(0.9, s));
      const double vhat = v / (1 - std::pow(0.999, s));
      w -= 0.1 * mhat / (std::sqrt(vhat) + 1e-8);
    }
    return w;
  };
  for (int j = 0; j < 4; ++j) {
    EXPECT_NEAR(after[j], adam(before[j], g[j], 2), 1e-5);
    EXPECT_NEAR(after[4 + j], adam(before[4 + j], g[j], 1), 1e-5);
    EXPECT_EQ(after[8 + j], before[8 + j]) << "a row not pushed moved";
  }
}

TEST(EmbeddingTable, TheLeastRecentlyPushedRowGivesWay) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::SGD, 0, /*max_rows=*/3));
  const std::vector<float> initial = Rows(&t, {1, 2, 3});
  const std::vector<float> zero(4, 0.0f);
  for (int64_t id : {1, 2, 3}) ASSERT_TRUE(t.Push({id}, zero).ok());
  ASSERT_TRUE(t.Push({2}, {1, 1, 1, 1}).ok());
  ASSERT_TRUE(t.Push({3}, zero).ok());
  ASSERT_TRUE(t.Push({1}, zero).ok());  // Now 2 is the least recently pushed.
  Rows(&t, {2});                        // A pull does not change the order.
  ASSERT_TRUE(t.Push({4}, zero).ok());
  EXPECT_EQ(t.rows(), 3);
  EXPECT_EQ(t.evicted(), 1);
  EXPECT_EQ(t.steps(2), 0) << "row 2 was not evicted";
  // Row 2 comes back at its initial values (and 3 gives way for it).
  EXPECT_EQ(Row(Rows(&t, {2}), 0), Row(initial, 1));
  ASSERT_TRUE(t.Push({2}, zero).ok());
  EXPECT_EQ(t.evicted(), 2);
  EXPECT_EQ(t.steps(3), 0) << "row 3 was not evicted";
  // A push with more distinct ids than the table holds is refused.
  EXPECT_EQ(t.Push({7, 8, 9, 10}, std::vector<float>(16, 0.0f)).code(),
            absl::StatusCode::kResourceExhausted);
}

// Regression (issue #38, 4): a pull made each unseen row, so a reader
// pulling unseen ids from a bounded table evicted every trained row.
TEST(EmbeddingTable, PullsOfUnseenIdsChangeNoRowAndStoreNothing) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::SGD, 0, /*max_rows=*/200));
  std::vector<int64_t> trained(50);
  for (int64_t i = 0; i < 50; ++i) trained[i] = 1000 * i + 7;
  ASSERT_TRUE(t.Push(trained, std::vector<float>(50 * 4, 0.25f)).ok());
  const std::vector<float> before = Rows(&t, trained);
  std::mt19937_64 random(38);
  std::vector<int64_t> unseen(size_t{1} << 20);
  for (int64_t& id : unseen) id = static_cast<int64_t>(random() >> 1);
  std::vector<float> out(unseen.size() * 4);
  ASSERT_TRUE(t.Pull(unseen, absl::MakeSpan(out)).ok());
  EXPECT_EQ(t.rows(), 50);
  EXPECT_EQ(t.evicted(), 0);
  EXPECT_EQ(Rows(&t, trained), before);
  // An unseen row reads as its initial values, and as a push would make it.
  EmbeddingTable fresh(Spec(v1::OptimizerSpec::SGD));
  ASSERT_TRUE(fresh.Push({unseen[5]}, std::vector<float>(4, 0.0f)).ok());
  EXPECT_EQ(Row(out, 5), Rows(&fresh, {unseen[5]}));
}

TEST(EmbeddingTable, BadRequestsAreRefusedAndNoRowMoves) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::ADAGRAD, /*num_rows=*/100));
  const std::vector<int64_t> all = {0, 1, 99};
  const std::vector<float> before = Rows(&t, all);
  const float nan = std::nanf("");
  struct Case {
    std::vector<int64_t> ids;
    std::vector<float> grads;
    absl::StatusCode code;
    std::string says;
  };
  const std::vector<Case> cases = {
      {{1, 100},
       std::vector<float>(8, 1),
       absl::StatusCode::kInvalidArgument,
       "id 100 is outside embedding 'user_id' of 100 rows"},
      {{-1},
       std::vector<float>(4, 1),
       absl::StatusCode::kInvalidArgument,
       "id -1 is outside"},
      {{1, 99},
       std::vector<float>(7, 1),
       absl::StatusCode::kInvalidArgument,
       "a push of 7 floats for 2 rows"},
      {{1, 99},
       {1, 1, 1, 1, 1, nan, 1, 1},
       absl::StatusCode::kInvalidArgument,
       "gradient of row 99 of embedding 'user_id' is nan at element 1"},
      {std::vector<int64_t>(kMaxRowsPerCall + 1, 1),
       std::vector<float>((kMaxRowsPerCall + 1) * 4, 1),
       absl::StatusCode::kResourceExhausted, "at most 1048576"},
  };
  for (const Case& c : cases) {
    absl::Status s = t.Push(c.ids, c.grads);
    EXPECT_EQ(s.code(), c.code) << c.says;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
  }
  std::vector<float> wrong(5);
  EXPECT_EQ(t.Pull({1}, absl::MakeSpan(wrong)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Rows(&t, all), before) << "a refused request moved a row";
  EXPECT_EQ(t.steps(1) + t.steps(99), 0);
}

TEST(EmbeddingTable, BadSpecsNameTheField) {
  const std::vector<
      std::pair<std::function<void(v1::EmbeddingSpec*)>, std::string>>
      cases = {
          {[](v1::EmbeddingSpec* s) { s->set_name("a b"); }, "embedding name"},
          {[](v1::EmbeddingSpec* s) { s->set_dim(0); }, "dim 0"},
          {[](v1::EmbeddingSpec* s) { s->set_num_rows(-5); }, "num_rows -5"},
          {[](v1::EmbeddingSpec* s) { s->set_max_rows_per_shard(-1); },
           "max_rows_per_shard -1"},
          {[](v1::EmbeddingSpec* s) {
             s->mutable_optimizer()->set_learning_rate(-1);
           },
           "learning_rate"},
      };
  for (const auto& [change, says] : cases) {
    v1::EmbeddingSpec s = Spec(v1::OptimizerSpec::SGD);
    change(&s);
    absl::Status status = ValidateEmbedding(s);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << says;
    EXPECT_NE(status.message().find(says), std::string::npos) << status;
  }
}

// A checkpoint holds every row with its optimizer state and step count, in
// least-recently-used order: the loaded table answers, updates and evicts
// exactly as the saved one.
TEST(EmbeddingTable, ACheckpointRestoresRowsStateAndEvictionOrder) {
  EmbeddingTable saved(Spec(v1::OptimizerSpec::ADAM, 0, /*max_rows=*/4));
  ASSERT_TRUE(saved.Push({30}, std::vector<float>(4, 0.25f)).ok());
  ASSERT_TRUE(saved.Push({20, 10}, std::vector<float>(8, 0.5f)).ok());
  ASSERT_TRUE(saved.Push({20}, {1, 2, 3, 4}).ok());
  ASSERT_TRUE(saved.Push({30}, {1, 2, 3, 4}).ok());
  // Oldest now: 10, then 20, then 30.
  v1::EmbeddingCheckpoint checkpoint;
  saved.Save(&checkpoint);
  auto loaded = EmbeddingTable::Load(checkpoint);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  for (EmbeddingTable* t : {&saved, loaded->get()}) {
    ASSERT_TRUE(t->Push({20, 30}, std::vector<float>(8, -1.0f)).ok());
    ASSERT_TRUE(t->Push({40, 50}, std::vector<float>(8, 0.1f)).ok());
  }  // Full at 4: evicts 10.
  EXPECT_EQ((*loaded)->steps(20), 3);
  EXPECT_EQ((*loaded)->evicted(), saved.evicted());
  EXPECT_EQ((*loaded)->rows(), 4);
  EXPECT_EQ((*loaded)->steps(10), 0) << "10 was the least recently used";
  EXPECT_EQ(Rows(loaded->get(), {20, 30, 40, 50}),
            Rows(&saved, {20, 30, 40, 50}));
}

TEST(EmbeddingTable, ACorruptCheckpointIsRefusedNamingTheFault) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::ADAGRAD, /*num_rows=*/100));
  ASSERT_TRUE(t.Push({1, 2}, std::vector<float>(8, 0.5f)).ok());
  v1::EmbeddingCheckpoint good;
  t.Save(&good);
  std::vector<std::pair<v1::EmbeddingCheckpoint, std::string>> cases;
  cases.emplace_back(good, "weights holds");
  cases.back().first.mutable_weights()->pop_back();
  cases.emplace_back(good, "slot1 holds");
  cases.back().first.clear_slot1();
  cases.emplace_back(good, "appears twice");
  const int64_t twice[2] = {1, 1};
  cases.back().first.set_ids(
      std::string(reinterpret_cast<const char*>(twice), sizeof(twice)));
  cases.emplace_back(good, "is outside");
  const int64_t outside[2] = {1, 100};
  cases.back().first.set_ids(
      std::string(reinterpret_cast<const char*>(outside), sizeof(outside)));
  cases.emplace_back(good, "dim 0");
  cases.back().first.mutable_spec()->set_dim(0);
  for (const auto& [checkpoint, says] : cases) {
    auto loaded = EmbeddingTable::Load(checkpoint);
    ASSERT_FALSE(loaded.ok()) << says;
    EXPECT_EQ(loaded.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(loaded.status().message().find(says), std::string::npos)
        << loaded.status();
  }
}

// Distinct ids spread evenly over the shards, for consecutive ids and for a
// Zipf-distributed stream (hashed features' popularity).
TEST(EmbeddingTable, IdsSpreadEvenlyOverShards) {
  constexpr int kShards = 8;
  std::vector<int> consecutive(kShards);
  for (int64_t id = 0; id < 80000; ++id) ++consecutive[RowShard(id, kShards)];
  for (int n : consecutive) EXPECT_NEAR(n, 10000, 400);

  // Zipf(1.1) over a million ids by inverse transform on the cumulative
  // weights; a fixed seed.
  constexpr int kIds = 1000000;
  std::vector<double> cumulative(kIds);
  double sum = 0;
  for (int i = 0; i < kIds; ++i) cumulative[i] = sum += std::pow(i + 1, -1.1);
  std::mt19937_64 random(42);
  std::uniform_real_distribution<double> u(0, sum);
  absl::flat_hash_map<int64_t, bool> seen;
  std::vector<int> distinct(kShards);
  for (int draw = 0; draw < 200000; ++draw) {
    const int64_t rank =
        std::lower_bound(cumulative.begin(), cumulative.end(), u(random)) -
        cumulative.begin();
    // Hashed features: the popular ids are not the small ones.
    const int64_t id = static_cast<int64_t>(rank * 2654435761u + 12345);
    if (seen.emplace(id, true).second) ++distinct[RowShard(id, kShards)];
  }
  const double mean = static_cast<double>(seen.size()) / kShards;
  for (int n : distinct) EXPECT_NEAR(n, mean, 0.05 * mean);
}

}  // namespace
}  // namespace asyncps
