// A replicated membership (issue #40): a worker's registration and its
// leaving stream to the backups, a joining backup's snapshot carries the
// membership, and each streamed push tells the backup the worker's clock.
// So a promoted backup authorizes the job's workers with the secrets they
// registered with, instead of answering "not registered" until their
// heartbeats register them again (the pause a failover cost a worker
// before: up to a heartbeat interval).
#include <thread>

#include "gtest/gtest.h"
#include "tests/server/replication_pair.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

using testing::JoinBackup;
using testing::Member;
using testing::Streamed;
using testing::StreamPair;

v1::RegisterRequest Join(int rank) {
  v1::RegisterRequest r;
  r.set_rank(rank);
  r.set_num_workers(2);
  return r;
}

TEST(ReplicatedMembership, APromotedBackupKnowsTheWorkersAndTheirClocks) {
  Member primary("p"), backup("b");
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  v1::DeclareModelRequest declare;
  *declare.mutable_spec() = testing::SmallModel();
  ASSERT_TRUE(primary.replication.Declare(declare).ok());
  // Rank 0 registers before the backup joins: the snapshot carries it.
  absl::StatusOr<v1::RegisterResponse> zero =
      primary.replication.Register(Join(0));
  ASSERT_TRUE(zero.ok()) << zero.status();

  StreamPair streams;
  std::thread serve = JoinBackup(&primary, &backup, &streams);
  ASSERT_FALSE(HasFailure());
  EXPECT_TRUE(backup.membership.Authorize(0, zero->secret(), 0).ok())
      << "the snapshot lost rank 0's registration";

  // Rank 1 registers, then pushes at clock 5: both stream.
  absl::StatusOr<v1::RegisterResponse> one;
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                one = primary.replication.Register(Join(1));
                return one.status();
              }).ok());
  v1::PushRequest push = testing::SmallModelPush(1.0f);
  push.set_rank(1);
  push.set_clock(5);
  v1::PushResponse answer;
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                return primary.replication.Push(push, PushPolicy(), &answer);
              }).ok());
  EXPECT_TRUE(backup.membership.Authorize(1, one->secret(), 5).ok())
      << "rank 1's registration was not streamed";
  EXPECT_EQ(backup.membership.MaxClock(), 5);
  EXPECT_EQ(backup.membership.Registered(), 2);

  // Rank 1 leaves: streamed too.
  v1::HeartbeatRequest leave;
  leave.set_rank(1);
  leave.set_incarnation(one->incarnation());
  leave.set_secret(one->secret());
  leave.set_clock(5);
  leave.set_leaving(true);
  ASSERT_TRUE(primary.membership.Heartbeat(leave).ok());
  ASSERT_TRUE(Streamed(&streams, &backup, [&] {
                primary.replication.MembershipChanged();
                return absl::OkStatus();
              }).ok());
  backup.membership.Restarted();  // Promoted.
  EXPECT_EQ(backup.membership.LiveCount(), 1) << "rank 0 live, rank 1 left";

  primary.replication.Fence("test over");
  serve.join();
}

}  // namespace
}  // namespace asyncps
