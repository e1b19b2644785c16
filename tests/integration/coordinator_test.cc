// The Coordinator's transactions (server/replica/coordinator.h), against
// the in-memory one and a real etcd alike: PutIf and DeleteIf write only
// while every condition holds, and write nothing otherwise. What a backup's
// removal of a dead primary's key rests on (ReplicaMember::
// DeposeDeadPrimary): it must fail if the primary recorded `insync` after
// the backup read it (it dropped the backup), or if the key is another
// epoch's.
#include <memory>
#include <string>

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

INSTANTIATE_TEST_SUITE_P(Coordinators, CoordinatorTest,
                         ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "etcd" : "memory";
                         });

}  // namespace
}  // namespace asyncps::testing
