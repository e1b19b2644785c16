// EmbeddingTable's reads, admission and expiry (server/embedding_table_read.cc,
// server/embedding_rows_policy.cc): a paged read is the table at its first
// page whatever pushes, evictions and expiries come between; an id's row
// starts at its admit_count-th push; a row untouched past its ttl goes;
// each against a model written out here, across a checkpoint.
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "server/embedding_table.h"
#include "tests/server/embedding_table_fixture.h"

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

// `t` through its checkpoint: a table loaded from what it saved (null,
// the test failed, if the load was refused).
std::unique_ptr<EmbeddingTable> SavedAndLoaded(const EmbeddingTable& t) {
  v1::EmbeddingCheckpoint saved;
  t.Save(&saved);
  auto loaded = EmbeddingTable::Load(saved);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *std::move(loaded) : nullptr;
}

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
  std::unique_ptr<EmbeddingTable> loaded = SavedAndLoaded(t);
  ASSERT_NE(loaded, nullptr);
  ASSERT_TRUE(loaded->Push({3}, one).ok());
  EXPECT_EQ(loaded->rows(), 3);
  EXPECT_EQ(loaded->Stats().not_admitted(), 6);
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
  std::unique_ptr<EmbeddingTable> loaded = SavedAndLoaded(t);
  ASSERT_NE(loaded, nullptr);
  ASSERT_TRUE(loaded->Push({4}, one).ok());  // 7: row 2 (4) expires.
  EXPECT_EQ(loaded->rows(), 1);
  EXPECT_EQ(loaded->Stats().expired(), 3);
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
