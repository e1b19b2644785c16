// The Coordinator's transactions (server/replica/coordinator.h), against
// the in-memory one and a real etcd alike: PutIf and DeleteIf write only
// while every condition holds, and write nothing otherwise. What a backup's
// removal of a dead primary's key rests on (ReplicaMember::
// DeposeDeadPrimary): it must fail if the primary recorded `insync` after
// the backup read it (it dropped the backup), or if the key is another
// epoch's.
#include <memory>
#include <string>

#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "gtest/gtest.h"
#include "server/replica/etcd_coordinator.h"
#include "server/replica/testing/memory_coordinator.h"
#include "tests/integration/etcd_process.h"

namespace asyncps::testing {
namespace {

class CoordinatorTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (GetParam()) {
      auto etcd = StartEtcd("etcd");
      ASSERT_TRUE(etcd.ok()) << etcd.status();
      etcd_ = *std::move(etcd);
      coordinator_ = std::make_unique<EtcdCoordinator>(etcd_.endpoint);
    } else {
      coordinator_ = memory_.NewView();
    }
  }

  EtcdProcess etcd_;
  MemoryCoordinator memory_{Clock::Real()};
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_P(CoordinatorTest, DeleteIfHoldsOnlyWhileEveryConditionDoes) {
  Coordinator& c = *coordinator_;
  auto lease = c.Grant(absl::Seconds(10));
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto epoch = c.CreateIfAbsent("/g/primary", "a", lease->first);
  ASSERT_TRUE(epoch.ok() && *epoch > 0) << epoch.status();
  ASSERT_TRUE(c.Put("/g/insync", "1:b", 0).ok());
  auto insync = c.Get("/g/insync");
  ASSERT_TRUE(insync.ok()) << insync.status();
  const std::vector<KeyRevision> as_read = {
      {"/g/primary", KeyRevision::Of::kCreate, *epoch},
      {"/g/insync", KeyRevision::Of::kMod, insync->mod_revision}};

  // The primary records `insync` again (it dropped the backup) after the
  // backup read it: the backup's removal fails and removes nothing.
  ASSERT_TRUE(c.Put("/g/insync", "1:", 0).ok());
  absl::Status s = c.DeleteIf(as_read, {"/g/primary"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  auto primary = c.Get("/g/primary");
  ASSERT_TRUE(primary.ok()) << primary.status();
  EXPECT_EQ(primary->create_revision, *epoch);

  // As read now: it holds, and the key goes.
  insync = c.Get("/g/insync");
  ASSERT_TRUE(insync.ok());
  const std::vector<KeyRevision> now = {
      {"/g/primary", KeyRevision::Of::kCreate, *epoch},
      {"/g/insync", KeyRevision::Of::kMod, insync->mod_revision}};
  ASSERT_TRUE(c.DeleteIf(now, {"/g/primary"}).ok());
  EXPECT_TRUE(absl::IsNotFound(c.Get("/g/primary").status()));

  // Another epoch's key is not removed by a look at the old one.
  auto next = c.CreateIfAbsent("/g/primary", "b", lease->first);
  ASSERT_TRUE(next.ok() && *next > *epoch);
  s = c.DeleteIf(now, {"/g/primary"});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  primary = c.Get("/g/primary");
  ASSERT_TRUE(primary.ok());
  EXPECT_EQ(primary->value, "b");
}

TEST_P(CoordinatorTest, PutIfWritesAllOrNothing) {
  Coordinator& c = *coordinator_;
  auto epoch = c.CreateIfAbsent("/g/primary", "a", 0);
  ASSERT_TRUE(epoch.ok() && *epoch > 0);
  const std::vector<KeyRevision> mine = {
      {"/g/primary", KeyRevision::Of::kCreate, *epoch}};
  ASSERT_TRUE(c.PutIf(mine, {{"/g/insync", "1:b", 0}, {"/g/x", "1", 0}}).ok());
  EXPECT_EQ(c.Get("/g/x")->value, "1");
  // Wrong epoch: neither key changes.
  absl::Status s =
      c.PutIf({{"/g/primary", KeyRevision::Of::kCreate, *epoch + 1000}},
              {{"/g/insync", "2:", 0}, {"/g/x", "2", 0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(c.Get("/g/insync")->value, "1:b");
  EXPECT_EQ(c.Get("/g/x")->value, "1");
}

// What a member's loop wakes on (ReplicaMember: the group's keys watched
// instead of polled every 50 ms): a watch calls once established, then
// after each change under its prefix: a put, a lease revoked, and (etcd,
// whose leases expire by themselves) a lease run out.
TEST_P(CoordinatorTest, AWatchSaysWhenTheKeysUnderItsPrefixChange) {
  Coordinator& c = *coordinator_;
  absl::Mutex mu;
  int calls = 0;
  std::unique_ptr<Coordinator::Watch> watch = c.WatchPrefix("/w/", [&] {
    absl::MutexLock lock(&mu);
    ++calls;
  });
  // Waits until the watch called more than `seen` times.
  auto called_after = [&](int seen) {
    absl::MutexLock lock(&mu);
    auto more = [&]()
                    ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return calls > seen; };
    mu.AwaitWithTimeout(absl::Condition(&more), absl::Seconds(10));
    return calls;
  };
  int seen = called_after(0);
  ASSERT_GE(seen, 1) << "the watch never said it was established";
  ASSERT_TRUE(c.Put("/w/a", "1", 0).ok());
  seen = called_after(seen);
  ASSERT_GE(seen, 2) << "a put under the prefix was not seen";
  auto lease = c.Grant(absl::Seconds(10));
  ASSERT_TRUE(lease.ok()) << lease.status();
  ASSERT_TRUE(c.Put("/w/b", "1", lease->first).ok());
  seen = called_after(seen);
  ASSERT_TRUE(c.Revoke(lease->first).ok());
  const int revoked = called_after(seen);
  EXPECT_GT(revoked, seen) << "a revoked lease's key going was not seen";
  EXPECT_FALSE(c.Get("/w/b").ok());
  if (GetParam()) {
    auto brief = c.Grant(absl::Seconds(1));
    ASSERT_TRUE(brief.ok()) << brief.status();
    ASSERT_TRUE(c.Put("/w/c", "1", brief->first).ok());
    seen = called_after(revoked);
    // Nothing else touches the keys: the next call is the expiry.
    EXPECT_GT(called_after(seen), seen) << "an expired lease was not seen";
    EXPECT_FALSE(c.Get("/w/c").ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Coordinators, CoordinatorTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "etcd" : "memory";
                         });

}  // namespace
}  // namespace asyncps::testing
