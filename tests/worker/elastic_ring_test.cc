// ElasticRing over an in-memory store and Gloo's ring on loopback: the job's
// first ring is the ranks below its starting size; a newcomer waits outside
// until the members say next, and is then in the ring; a member that died
// (no longer live) is not waited for; a rank that said next too late is
// left out and gets into the one after. Each ring is checked by summing
// over it.
#include "worker/elastic_ring.h"

#include <algorithm>
#include <map>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/worker/memory_store.h"

namespace asyncps {
namespace {

// Who shard 0 counts live, as the test says.
class Live {
 public:
  explicit Live(std::vector<int> ranks) : ranks_(std::move(ranks)) {}
  void Set(std::vector<int> ranks) {
    absl::MutexLock lock(&mu_);
    ranks_ = std::move(ranks);
  }
  ElasticRing::LiveFn Fn() {
    return [this] {
      absl::MutexLock lock(&mu_);
      return ranks_;
    };
  }

 private:
  absl::Mutex mu_;
  std::vector<int> ranks_ ABSL_GUARDED_BY(mu_);
};

class ElasticRingTest : public ::testing::Test {
 protected:
  // The ring object of `rank` (made at the first call), in a job that
  // started with `start` ranks.
  ElasticRing* Ring(int rank, int start = 2) {
    auto& r = rings_[rank];
    if (r == nullptr) {
      CollectiveConfig c;
      c.rank = rank;
      c.num_workers = start;
      c.timeout = absl::Seconds(20);
      c.join_timeout = absl::Seconds(3);
      r = std::make_unique<ElasticRing>(&store_, c, live_.Fn());
    }
    return r.get();
  }
  // A rank's process died: its ring object is gone.
  void Kill(int rank) {
    rings_.erase(rank);
    collectives_.erase(rank);
  }

  // `ranks` each join their next ring at once, in threads; all must.
  void JoinAll(const std::vector<int>& ranks) {
    std::vector<ElasticRing*> rings;
    for (int r : ranks) rings.push_back(Ring(r));
    std::vector<absl::StatusOr<std::unique_ptr<Collective>>> got(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back(
          [&, i] { got[i] = rings[i]->Join(absl::Now() + absl::Seconds(20)); });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < ranks.size(); ++i) {
      ASSERT_TRUE(got[i].ok())
          << "rank " << ranks[i] << ": " << got[i].status();
      collectives_[ranks[i]] = *std::move(got[i]);
    }
  }

  // Every rank of `ranks` is in the same ring of exactly them, and a sum
  // of (rank + 1) over it is the sum over `ranks`.
  void ExpectRing(const std::vector<int>& ranks) {
    float want = 0;
    for (int r : ranks) want += static_cast<float>(r + 1);
    std::vector<std::vector<float>> data;
    for (int r : ranks) {
      EXPECT_EQ(Ring(r)->members(), ranks) << "rank " << r;
      EXPECT_EQ(Ring(r)->members()[Ring(r)->index()], r);
      EXPECT_EQ(Ring(r)->generation(), Ring(ranks[0])->generation());
      data.push_back({static_cast<float>(r + 1)});
    }
    std::vector<absl::Status> done(ranks.size());
    std::vector<std::thread> threads;
    for (size_t i = 0; i < ranks.size(); ++i) {
      threads.emplace_back([&, i] {
        done[i] = collectives_[ranks[i]]->AllreduceSum(&data[i], 0);
      });
    }
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < ranks.size(); ++i) {
      ASSERT_TRUE(done[i].ok()) << done[i];
      EXPECT_EQ(data[i], std::vector<float>{want}) << "rank " << ranks[i];
    }
  }

  MemoryStore store_;
  Live live_{{0, 1}};
  std::map<int, std::unique_ptr<ElasticRing>> rings_;
  std::map<int, std::unique_ptr<Collective>> collectives_;
};

TEST_F(ElasticRingTest, TheFirstRingIsTheRanksTheJobStartedWith) {
  JoinAll({0, 1});
  ExpectRing({0, 1});
  EXPECT_EQ(Ring(0)->generation(), 1);
  EXPECT_FALSE(Ring(0)->OutsiderWaiting());
}

TEST_F(ElasticRingTest, ANewcomerWaitsOutsideUntilTheMembersSayNext) {
  JoinAll({0, 1});
  live_.Set({0, 1, 2});
  absl::StatusOr<std::unique_ptr<Collective>> joined;
  std::thread newcomer(
      [&] { joined = Ring(2)->Join(absl::Now() + absl::Seconds(20)); });
  // The members see it once it has announced itself (what they vote).
  bool seen = false;
  for (int i = 0; i < 200 && !seen; ++i) {
    seen = Ring(0)->OutsiderWaiting() && Ring(1)->OutsiderWaiting();
    if (!seen) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(seen);
  JoinAll({0, 1});
  newcomer.join();
  ASSERT_TRUE(joined.ok()) << joined.status();
  collectives_[2] = *std::move(joined);
  ExpectRing({0, 1, 2});
  EXPECT_EQ(Ring(2)->generation(), 2);
}

TEST_F(ElasticRingTest, AMemberNoLongerLiveIsNotWaitedFor) {
  live_.Set({0, 1, 2});
  Ring(2, 3);
  Ring(0, 3);
  Ring(1, 3);
  JoinAll({0, 1, 2});
  ExpectRing({0, 1, 2});
  // Rank 0, the leader of the ring, dies; shard 0 stops counting it.
  Kill(0);
  live_.Set({1, 2});
  JoinAll({1, 2});
  ExpectRing({1, 2});
  // Its replacement comes back under the same rank and is let in at the
  // next change, as the lowest rank it then leads.
  live_.Set({0, 1, 2});
  absl::StatusOr<std::unique_ptr<Collective>> joined;
  std::thread replacement(
      [&] { joined = Ring(0, 3)->Join(absl::Now() + absl::Seconds(20)); });
  while (!Ring(1)->OutsiderWaiting()) absl::SleepFor(absl::Milliseconds(20));
  JoinAll({1, 2});
  replacement.join();
  ASSERT_TRUE(joined.ok()) << joined.status();
  collectives_[0] = *std::move(joined);
  ExpectRing({0, 1, 2});
}

TEST_F(ElasticRingTest, AStartWaitsForEveryRankBelowItsSize) {
  live_.Set({1});
  absl::StatusOr<std::unique_ptr<Collective>> joined;
  std::thread one(
      [&] { joined = Ring(1)->Join(absl::Now() + absl::Seconds(20)); });
  // Rank 1 alone forms nothing: no generation 1 is written without rank 0.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(
      store_.StoreGet(ElasticRing::MembersKey(1), absl::ZeroDuration()).ok());
  live_.Set({0, 1});
  auto zero = Ring(0)->Join(absl::Now() + absl::Seconds(20));
  one.join();
  ASSERT_TRUE(zero.ok()) << zero.status();
  ASSERT_TRUE(joined.ok()) << joined.status();
  collectives_[0] = *std::move(zero);
  collectives_[1] = *std::move(joined);
  ExpectRing({0, 1});
}

}  // namespace
}  // namespace asyncps
