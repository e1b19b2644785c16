// EmbeddingTable (server/embedding_table.h) against references written out
// here: SGD and AdaGrad on summed duplicate ids, lazy Adam's per-row steps,
// rows made the same on every table, least-recently-used eviction, ids
// spread evenly over shards (Zipf too), and every bad request refused with
// no row moved.
#include "server/embedding_table.h"

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace asyncps {
namespace {

v1::EmbeddingSpec Spec(v1::OptimizerSpec::Kind kind, int64_t num_rows = 0,
                       int64_t max_rows = 0) {
  v1::EmbeddingSpec s;
  s.set_name("user_id");
  s.set_dim(4);
  s.set_num_rows(num_rows);
  s.set_max_rows_per_shard(max_rows);
  s.set_seed(7);
  s.mutable_init()->set_kind(v1::Initializer::UNIFORM);
  s.mutable_init()->set_low(-0.5f);
  s.mutable_init()->set_high(0.5f);
  v1::OptimizerSpec* o = s.mutable_optimizer();
  o->set_kind(kind);
  o->set_learning_rate(0.1f);
  o->set_epsilon(1e-8f);
  o->set_beta1(0.9f);
  o->set_beta2(0.999f);
  o->set_initial_accumulator_value(0.1f);
  EXPECT_TRUE(ValidateEmbedding(s).ok()) << ValidateEmbedding(s);
  return s;
}

std::vector<float> Rows(EmbeddingTable* t, const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * 4);
  EXPECT_TRUE(t->Pull(ids, absl::MakeSpan(out)).ok());
  return out;
}

// Row `k` of `rows` (dim 4).
std::vector<float> Row(const std::vector<float>& rows, size_t k) {
  return {rows.begin() + k * 4, rows.begin() + k * 4 + 4};
}

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

namespace asyncps {
namespace {

// Every page of one read (Read from snapshot 0 to the last page), its ids
// and rows; `between` runs after the first page.
struct Export {
  std::vector<int64_t> ids;
  std::vector<float> rows;
};
template <typename F>
Export ReadPaged(EmbeddingTable* t, int64_t page, F between) {
  Export e;
  uint64_t snapshot = 0;
  int64_t start = 0;
  bool first = true;
  while (start >= 0) {
    absl::StatusOr<int64_t> next =
        t->Read(&snapshot, start, page, &e.ids, &e.rows, absl::Now());
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok()) break;
    start = *next;
    if (first) between();
    first = false;
  }
  return e;
}

// Issue #43: a read paged by slot while pushes evicted rows and reused
// their slots skipped some rows and gave others twice. A read is now the
// table at its first page: the rows held then, with their values then,
// each once, whatever pushes and evictions came between the pages.
TEST(EmbeddingTable, AReadIsTheTableAtItsFirstPage) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::SGD, 0, /*max_rows=*/6));
  const std::vector<int64_t> held = {1, 2, 3, 4, 5, 6};
  for (int64_t id : held) {
    ASSERT_TRUE(t.Push({id}, {1, 2, 3, 4}).ok());
  }
  const std::vector<float> then = Rows(&t, held);
  const Export e = ReadPaged(&t, 2, [&] {
    // Rows 1-3 change, and 4 new ids evict four rows into their slots.
    ASSERT_TRUE(t.Push({1, 2, 3}, std::vector<float>(12, 5.0f)).ok());
    ASSERT_TRUE(t.Push({7, 8, 9, 10}, std::vector<float>(16, 1.0f)).ok());
  });
  ASSERT_EQ(t.evicted(), 4);
  std::map<int64_t, std::vector<float>> got;
  for (size_t k = 0; k < e.ids.size(); ++k) {
    EXPECT_TRUE(got.emplace(e.ids[k], Row(e.rows, k)).second)
        << "id " << e.ids[k] << " read twice";
  }
  ASSERT_EQ(got.size(), held.size());
  for (size_t k = 0; k < held.size(); ++k) {
    EXPECT_EQ(got[held[k]], Row(then, k)) << "id " << held[k];
  }
  // The next read sees the table as it is now.
  const Export now = ReadPaged(&t, 4, [] {});
  // (1-6 pushed in order, then 1-3: 4, 5, 6 and 1 were the least recent.)
  EXPECT_EQ(std::set<int64_t>(now.ids.begin(), now.ids.end()),
            (std::set<int64_t>{2, 3, 7, 8, 9, 10}));
  EXPECT_EQ(now.ids.size(), 6u);
}

TEST(EmbeddingTable, ASnapshotEndsWithItsLastPageOrWhenLeftIdle) {
  EmbeddingTable t(Spec(v1::OptimizerSpec::SGD));
  ASSERT_TRUE(t.Push({1, 2, 3}, std::vector<float>(12, 1.0f)).ok());
  std::vector<int64_t> ids;
  std::vector<float> rows;
  const absl::Time now = absl::Now();
  uint64_t done = 0;
  ASSERT_EQ(*t.Read(&done, 0, 10, &ids, &rows, now), -1);
  ASSERT_NE(done, 0u);
  // Read again from a snapshot that ended: refused, saying to start over.
  absl::StatusOr<int64_t> gone = t.Read(&done, 0, 10, &ids, &rows, now);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gone.status().message().find("from the start"), std::string::npos)
      << gone.status();
  uint64_t idle = 0;
  ASSERT_EQ(*t.Read(&idle, 0, 1, &ids, &rows, now), 1);
  EXPECT_EQ(t.open_snapshots(), 1);
  // A reader gone past kSnapshotIdle: its snapshot is dropped by the next
  // read that opens one.
  uint64_t other = 0;
  ASSERT_TRUE(
      t.Read(&other, 0, 1, &ids, &rows, now + kSnapshotIdle + absl::Seconds(1))
          .ok());
  EXPECT_EQ(t.open_snapshots(), 1);
  EXPECT_EQ(
      t.Read(&idle, 1, 1, &ids, &rows, now + kSnapshotIdle).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace asyncps

namespace asyncps {
namespace {

// Issue #43, admission: an id gets a row only at its admit_count-th push;
// until then its pushes are dropped (counted) and a pull answers the
// initial values. Against a model written out here: per id, the pushes
// seen, and the row's value once admitted (SGD, lr 0.1, gradient 1).
TEST(EmbeddingTable, AnIdGetsARowOnlyAtItsAdmitCountthPush) {
  v1::EmbeddingSpec spec = Spec(v1::OptimizerSpec::SGD);
  spec.set_admit_count(3);
  EmbeddingTable t(spec);
  const std::vector<float> initial = Rows(&t, {1, 2, 3});
  const std::vector<float> one(4, 1.0f);
  std::map<int64_t, int> seen;
  std::map<int64_t, int> applied;  // Pushes applied to the row.
  const std::vector<int64_t> order = {1, 2, 1, 3, 1, 2, 1, 2, 3, 2};
  for (int64_t id : order) {
    ASSERT_TRUE(t.Push({id}, one).ok());
    if (++seen[id] >= 3) ++applied[id];
  }
  EXPECT_EQ(t.rows(), 2);  // 1 and 2 reached 3 pushes; 3 has 2.
  EXPECT_EQ(t.Stats().not_admitted(), 2 + 2 + 2);
  const std::vector<float> now = Rows(&t, {1, 2, 3});
  for (int64_t k = 0; k < 3; ++k) {
    for (int j = 0; j < 4; ++j) {
      EXPECT_FLOAT_EQ(now[k * 4 + j],
                      initial[k * 4 + j] - 0.1f * applied[k + 1])
          << "id " << k + 1;
    }
  }
  // The counts are in the checkpoint: a restored table admits id 3 at its
  // next push, as this one would.
  v1::EmbeddingCheckpoint saved;
  t.Save(&saved);
  auto loaded = EmbeddingTable::Load(saved);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE((*loaded)->Push({3}, one).ok());
  EXPECT_EQ((*loaded)->rows(), 3);
  EXPECT_EQ((*loaded)->Stats().not_admitted(), 6);
}

// Expiry: a row not pushed for ttl_pushes of the table's pushes (on this
// shard) is removed and counted; it comes back at its initial values.
TEST(EmbeddingTable, ARowUntouchedForItsTtlExpires) {
  v1::EmbeddingSpec spec = Spec(v1::OptimizerSpec::SGD);
  spec.set_ttl_pushes(3);
  EmbeddingTable t(spec);
  const std::vector<float> initial = Rows(&t, {1, 2, 3, 4});
  const std::vector<float> one(4, 1.0f);
  ASSERT_TRUE(t.Push({1}, one).ok());  // Push 1.
  ASSERT_TRUE(t.Push({2}, one).ok());  // 2.
  ASSERT_TRUE(t.Push({3}, one).ok());  // 3.
  ASSERT_TRUE(t.Push({2}, one).ok());  // 4: row 1 last pushed at 1.
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(t.Stats().expired(), 1);
  EXPECT_EQ(Row(Rows(&t, {1}), 0), Row(initial, 0)) << "row 1 came back";
  ASSERT_TRUE(t.Push({4}, one).ok());  // 5: none older than 3 pushes.
  ASSERT_TRUE(t.Push({4}, one).ok());  // 6: row 3 (3) expires, 2 (4) not.
  EXPECT_EQ(t.Stats().expired(), 2);
  EXPECT_EQ(t.rows(), 2);
  EXPECT_EQ(t.steps(2), 2);
  EXPECT_EQ(t.steps(4), 2);
  // The same after a checkpoint: the table's pushes and each row's last.
  v1::EmbeddingCheckpoint saved;
  t.Save(&saved);
  auto loaded = EmbeddingTable::Load(saved);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ASSERT_TRUE((*loaded)->Push({4}, one).ok());  // 7: row 2 (4) expires.
  EXPECT_EQ((*loaded)->rows(), 1);
  EXPECT_EQ((*loaded)->Stats().expired(), 3);
}

// An expired row's slot is filled by the last one: a read open across it
// still gives each row of its snapshot once.
TEST(EmbeddingTable, ExpiryDuringAReadKeepsTheSnapshot) {
  v1::EmbeddingSpec spec = Spec(v1::OptimizerSpec::SGD);
  spec.set_ttl_pushes(4);
  EmbeddingTable t(spec);
  const std::vector<float> one(4, 1.0f);
  for (int64_t id : {1, 2, 3, 4}) ASSERT_TRUE(t.Push({id}, one).ok());
  const std::vector<float> then = Rows(&t, {1, 2, 3, 4});
  std::vector<int64_t> ids;
  std::vector<float> rows;
  uint64_t snapshot = 0;
  ASSERT_EQ(*t.Read(&snapshot, 0, 2, &ids, &rows, absl::Now()), 2);
  for (int k = 0; k < 3; ++k) ASSERT_TRUE(t.Push({4}, one).ok());
  EXPECT_EQ(t.Stats().expired(), 3);  // 1, 2 and 3.
  ASSERT_EQ(*t.Read(&snapshot, 2, 2, &ids, &rows, absl::Now()), -1);
  std::map<int64_t, std::vector<float>> got;
  for (size_t k = 0; k < ids.size(); ++k) got.emplace(ids[k], Row(rows, k));
  ASSERT_EQ(got.size(), 4u);
  for (int64_t id = 1; id <= 4; ++id) {
    EXPECT_EQ(got[id], Row(then, id - 1)) << "id " << id;
  }
}

absl::Time fake_now = absl::FromUnixSeconds(1000);
absl::Time FakeNow() { return fake_now; }

TEST(EmbeddingTable, ARowUntouchedForItsTtlSecondsExpires) {
  v1::EmbeddingSpec spec = Spec(v1::OptimizerSpec::SGD);
  spec.set_ttl_seconds(10);
  EmbeddingTable t(spec);
  t.set_clock_for_testing(FakeNow);
  const std::vector<float> one(4, 1.0f);
  ASSERT_TRUE(t.Push({1}, one).ok());  // At 1000.
  fake_now += absl::Seconds(5);
  ASSERT_TRUE(t.Push({2}, one).ok());  // At 1005.
  fake_now += absl::Seconds(9);
  ASSERT_TRUE(t.Push({2}, one).ok());  // At 1014: row 1 is 14 s old.
  EXPECT_EQ(t.rows(), 1);
  EXPECT_EQ(t.Stats().expired(), 1);
  EXPECT_EQ(t.steps(2), 2);
}

TEST(EmbeddingTable, BadAdmissionAndTtlNameTheField) {
  v1::EmbeddingSpec s = Spec(v1::OptimizerSpec::SGD);
  s.set_admit_count(-1);
  EXPECT_NE(ValidateEmbedding(s).message().find("admit_count"),
            std::string::npos);
  s = Spec(v1::OptimizerSpec::SGD);
  s.set_ttl_pushes(-5);
  EXPECT_NE(ValidateEmbedding(s).message().find("ttl_pushes"),
            std::string::npos);
  s = Spec(v1::OptimizerSpec::SGD);
  s.set_ttl_seconds(std::nan(""));
  EXPECT_NE(ValidateEmbedding(s).message().find("ttl_seconds"),
            std::string::npos);
  s.set_ttl_seconds(10);
  s.set_ttl_pushes(10);
  EXPECT_NE(ValidateEmbedding(s).message().find("not both"), std::string::npos);
}

}  // namespace
}  // namespace asyncps
