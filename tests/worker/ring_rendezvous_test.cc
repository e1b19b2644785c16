// RingRendezvous over an in-memory store and Gloo's ring on loopback: ranks
// meet at the highest generation asked for, and an address left in the
// store by a rank that died while joining (what a chaos run's SIGKILL
// leaves) moves the ring on to the next generation instead of failing the
// rank that reads it.
#include "worker/ring_rendezvous.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/worker/memory_store.h"

namespace asyncps {
namespace {

CollectiveConfig Ring(int rank) {
  CollectiveConfig c;
  c.rank = rank;
  c.num_workers = 2;
  c.timeout = absl::Seconds(20);
  c.join_timeout = absl::Seconds(2);
  return c;
}

// Both ranks sum {rank + 1} over `c`: 3 on each.
void ExpectSums(Collective* c0, Collective* c1) {
  std::vector<float> a = {1.0f}, b = {2.0f};
  absl::Status s1;
  std::thread t([&] { s1 = c1->AllreduceSum(&b, 0); });
  const absl::Status s0 = c0->AllreduceSum(&a, 0);
  t.join();
  ASSERT_TRUE(s0.ok()) << s0;
  ASSERT_TRUE(s1.ok()) << s1;
  EXPECT_EQ(a, std::vector<float>{3.0f});
  EXPECT_EQ(b, std::vector<float>{3.0f});
}

TEST(RingRendezvous, AFreshRankJoinsTheGenerationTheOthersAskFor) {
  MemoryStore store;
  // A survivor of four broken rings asks for the fifth.
  ASSERT_TRUE(store.StoreSet(RingRendezvous::GenerationKey(0), "5").ok());
  RingRendezvous r0(&store, Ring(0)), r1(&store, Ring(1));
  absl::StatusOr<std::unique_ptr<Collective>> c0, c1;
  std::thread t([&] { c1 = r1.Join(absl::Now() + absl::Seconds(20)); });
  c0 = r0.Join(absl::Now() + absl::Seconds(20));
  t.join();
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_EQ(r0.generation(), 5);
  EXPECT_EQ(r1.generation(), 5);
  ExpectSums(c0->get(), c1->get());
}

// Starts rank 0 fresh on `store`, waits until it asks for generation 2
// (it met generation 1 and could not join it), then a fresh rank 1; both
// must form generation 2.
void ExpectRingMovesOn(MemoryStore* store) {
  RingRendezvous r0(store, Ring(0));
  absl::StatusOr<std::unique_ptr<Collective>> c0;
  std::thread t([&] { c0 = r0.Join(absl::Now() + absl::Seconds(30)); });
  bool moved = false;
  for (int i = 0; i < 300 && !moved; ++i) {
    auto g =
        store->StoreGet(RingRendezvous::GenerationKey(0), absl::ZeroDuration());
    moved = g.ok() && *g == "2";
    if (!moved) absl::SleepFor(absl::Milliseconds(50));
  }
  RingRendezvous r1(store, Ring(1));
  auto c1 = r1.Join(absl::Now() + absl::Seconds(20));
  t.join();
  ASSERT_TRUE(moved);
  ASSERT_TRUE(c0.ok()) << c0.status();
  ASSERT_TRUE(c1.ok()) << c1.status();
  EXPECT_EQ(r0.generation(), 2);
  EXPECT_EQ(r1.generation(), 2);
  ExpectSums(c0->get(), c1->get());
}

TEST(RingRendezvous, ARankThatDiedBeforeJoiningIsNotWaitedForLong) {
  MemoryStore store;
  {
    // Rank 1 asks for generation 1 and dies before rank 0 comes.
    RingRendezvous dead(&store, Ring(1));
    ASSERT_FALSE(dead.Join(absl::Now() + absl::Seconds(1)).ok());
  }
  // Rank 0 joins generation 1, waits for rank 1's address for the join
  // timeout, and asks for the next.
  ExpectRingMovesOn(&store);
}

TEST(RingRendezvous, AnAddressLeftByADeadRankMovesTheRingOn) {
  MemoryStore store;
  {
    // A ring of generation 1 forms, then both its processes die: their
    // listening sockets are gone, their addresses stay in the store.
    RingRendezvous r0(&store, Ring(0)), r1(&store, Ring(1));
    absl::StatusOr<std::unique_ptr<Collective>> c1;
    std::thread t([&] { c1 = r1.Join(absl::Now() + absl::Seconds(20)); });
    auto c0 = r0.Join(absl::Now() + absl::Seconds(20));
    t.join();
    ASSERT_TRUE(c0.ok()) << c0.status();
    ASSERT_TRUE(c1.ok()) << c1.status();
  }
  // A fresh rank 0 meets generation 1, fails to reach rank 1 at its old
  // address, and asks for the next; rank 1's replacement joins it there.
  ExpectRingMovesOn(&store);
}

}  // namespace
}  // namespace asyncps
