// Membership with a manual clock: liveness, rejoining, clocks and gaps, and
// the secrets that bind a rank to its registration.
#include "server/membership.h"

#include "gtest/gtest.h"

namespace asyncps {
namespace {

v1::RegisterRequest Join(int rank, int num_workers = 2, uint64_t secret = 0) {
  v1::RegisterRequest r;
  r.set_rank(rank);
  r.set_num_workers(num_workers);
  r.set_secret(secret);
  return r;
}

// Asynchronous DiLoCo's dynamic rounds (issue #42): a heartbeat's answer
// carries the fastest rate among the live workers that have not left.
TEST(Membership, FastestStepsPerSecondIsOverTheLiveWorkers) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(2));
  EXPECT_EQ(m.FastestStepsPerSecond(), 0.0);
  auto a = m.Register(Join(0));
  auto b = m.Register(Join(1));
  ASSERT_TRUE(a.ok() && b.ok());
  auto beat = [&](const v1::RegisterResponse& r, int rank, double rate,
                  bool leaving) {
    v1::HeartbeatRequest hb;
    hb.set_rank(rank);
    hb.set_incarnation(r.incarnation());
    hb.set_secret(r.secret());
    hb.mutable_progress()->set_steps_per_second(rate);
    hb.set_leaving(leaving);
    ASSERT_TRUE(m.Heartbeat(hb).ok());
  };
  beat(*a, 0, 8.0, false);
  beat(*b, 1, 2.0, false);
  EXPECT_EQ(m.FastestStepsPerSecond(), 8.0);
  beat(*a, 0, 8.0, /*leaving=*/true);  // Left: not the job's pace.
  EXPECT_EQ(m.FastestStepsPerSecond(), 2.0);
  clock.Advance(absl::Seconds(3));  // Rank 1 silent past the timeout.
  EXPECT_EQ(m.FastestStepsPerSecond(), 0.0);
}

TEST(Membership, SilentWorkerStopsBeingLiveAndRejoins) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(2));
  auto a = m.Register(Join(0));
  auto b = m.Register(Join(1));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(m.LiveCount(), 2);
  EXPECT_EQ(m.Expected(), 2);
  EXPECT_EQ(m.Registered(), 2);
  EXPECT_EQ(m.LivenessChanges().size(), 2u);  // Both became live.
  clock.Advance(absl::Seconds(1));
  m.Touch(0, 5);
  clock.Advance(absl::Seconds(1.5));
  EXPECT_EQ(m.LiveCount(), 1);
  auto changes = m.LivenessChanges();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].rank, 1);
  EXPECT_FALSE(changes[0].live);
  EXPECT_FALSE(changes[0].left);
  EXPECT_EQ(m.MinLiveClock(), 5);
  // Rank 1 comes back: new incarnation, resumes one below the front.
  auto again = m.Register(Join(1));
  ASSERT_TRUE(again.ok());
  EXPECT_GT(again->incarnation(), b->incarnation());
  EXPECT_EQ(again->resume_clock(), 4);
  EXPECT_EQ(again->attempt(), 1);  // The clock advanced since b.
  EXPECT_EQ(m.LiveCount(), 2);
  // The old incarnation's heartbeat is refused.
  v1::HeartbeatRequest hb;
  hb.set_rank(1);
  hb.set_incarnation(b->incarnation());
  EXPECT_EQ(m.Heartbeat(hb).code(), absl::StatusCode::kFailedPrecondition);
  hb.set_incarnation(again->incarnation());
  hb.set_clock(6);
  EXPECT_EQ(m.Heartbeat(hb).code(), absl::StatusCode::kPermissionDenied);
  hb.set_secret(b->secret());  // The superseded registration's.
  EXPECT_EQ(m.Heartbeat(hb).code(), absl::StatusCode::kPermissionDenied);
  hb.set_secret(again->secret());
  EXPECT_TRUE(m.Heartbeat(hb).ok());
  EXPECT_EQ(m.MaxClock(), 6);
  // Rank 0 reached clock 5 while rank 1 was live at 0.
  EXPECT_EQ(m.MaxClockGap(), 5);
}

TEST(Membership, RestartedJobGetsTheSameResumeClockAndAttemptOnEveryRank) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(2));
  auto a = m.Register(Join(0));
  auto b = m.Register(Join(1));
  ASSERT_TRUE(a.ok() && b.ok());
  m.Touch(0, 40);
  m.Touch(1, 40);
  for (int64_t attempt = 1; attempt <= 2; ++attempt) {
    // The same (live) workers register again, with their secrets.
    a = m.Register(Join(0, 2, a->secret()));
    b = m.Register(Join(1, 2, b->secret()));
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(a->resume_clock(), 39);
    EXPECT_EQ(b->resume_clock(), 39);
    EXPECT_EQ(a->attempt(), attempt);
    EXPECT_EQ(b->attempt(), attempt);
  }
}

// A backup promoted (or a shard restored from a checkpoint) knows no
// worker's clock: the job's front comes from its state (bsp: the step its
// slices applied). Before, a replacement that registered first resumed at
// clock 0 and redid every step of the job, each push dropped as late (the
// history checker's bsp/r2 seed 6).
TEST(Membership, AReplacementResumesAtTheFrontTheShardsStateKnows) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(2));
  m.NoteJobFront(48);
  auto a = m.Register(Join(0));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->resume_clock(), 47);
  m.NoteJobFront(10);  // Never backwards.
  EXPECT_EQ(m.MaxClock(), 48);
}

TEST(Membership, LeavingWorkerStopsBeingLiveAtOnce) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(30));
  auto a = m.Register(Join(0));
  ASSERT_TRUE(m.Register(Join(1)).ok());
  m.Touch(1, 3);
  v1::HeartbeatRequest bye;
  bye.set_rank(0);
  bye.set_incarnation(a->incarnation());
  bye.set_clock(1);
  bye.set_leaving(true);
  bye.set_secret(a->secret());
  ASSERT_TRUE(m.Heartbeat(bye).ok());
  EXPECT_EQ(m.LiveCount(), 1);
  EXPECT_EQ(m.MinLiveClock(), 3);  // Rank 0's clock 1 no longer holds anyone.
  ASSERT_TRUE(m.Register(Join(0)).ok());
  EXPECT_EQ(m.LiveCount(), 2);
}

// The job is done (ps_server --exit_when_done) only once every rank it
// expects has left cleanly: not when some have, not when one fell silent,
// not once a finished rank registers again.
TEST(Membership, JobIsDoneWhenEveryExpectedRankHasLeft) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(30));
  EXPECT_FALSE(m.AllFinished()) << "no job yet";
  auto leave = [&](int rank, const v1::RegisterResponse& r) {
    v1::HeartbeatRequest bye;
    bye.set_rank(rank);
    bye.set_incarnation(r.incarnation());
    bye.set_leaving(true);
    bye.set_secret(r.secret());
    ASSERT_TRUE(m.Heartbeat(bye).ok());
  };
  auto a = m.Register(Join(0, 3));
  ASSERT_TRUE(a.ok());
  leave(0, *a);
  EXPECT_FALSE(m.AllFinished()) << "ranks 1 and 2 never came";
  auto b = m.Register(Join(1, 3));
  auto c = m.Register(Join(2, 3));
  ASSERT_TRUE(b.ok() && c.ok());
  leave(1, *b);
  clock.Advance(absl::Seconds(60));  // Rank 2 falls silent: not finished.
  EXPECT_FALSE(m.AllFinished());
  leave(2, *c);
  EXPECT_TRUE(m.AllFinished());
  ASSERT_TRUE(m.Register(Join(1, 3)).ok());  // A rank back at work.
  EXPECT_FALSE(m.AllFinished());
}

TEST(Membership, UnknownRankAndBadRankRefused) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(2));
  v1::HeartbeatRequest hb;
  hb.set_rank(3);
  EXPECT_EQ(m.Heartbeat(hb).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(m.Register(Join(-2)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto r = m.Register(Join(-1));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->rank(), 0);
  EXPECT_EQ(m.Register(Join(-1))->rank(), 1);
  // Every rank of the job is live: none to assign.
  auto full = m.Register(Join(-1));
  EXPECT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("every rank"), std::string::npos)
      << full.status();
  // Once one is silent past the timeout, it is assigned again.
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(m.Register(Join(1)).ok());
  EXPECT_EQ(m.Register(Join(-1))->rank(), 0);
}

TEST(Membership, AbsurdOrDisagreeingWorkerCountsAreRefused) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(5));
  EXPECT_EQ(m.Register(Join(0, 2000000000)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Join(0, 0)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(m.Register(Join(2, 2)).status().code(),
            absl::StatusCode::kInvalidArgument);  // Rank outside the job.
  ASSERT_TRUE(m.Register(Join(0, 2)).ok());
  // One call may not make every bsp step wait for 60000 workers.
  auto s = m.Register(Join(1, 60000));
  EXPECT_EQ(s.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.status().message().find("--num_workers"), std::string::npos);
  EXPECT_EQ(m.Expected(), 2);
  ASSERT_TRUE(m.Register(Join(1, 2)).ok());
  // Once the job's workers are gone, a new job may be another size.
  clock.Advance(absl::Seconds(6));
  ASSERT_TRUE(m.Register(Join(0, 3)).ok());
  EXPECT_EQ(m.Expected(), 3);
}

TEST(Membership, AsyncReplacementResumesWhereItsRankStopped) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(5), Membership::Resume::kOwnClock);
  auto zero = m.Register(Join(0, 2));
  ASSERT_TRUE(zero.ok());
  ASSERT_TRUE(m.Register(Join(1, 2)).ok());
  m.Touch(0, 90);
  m.Touch(1, 40);
  clock.Advance(absl::Seconds(6));  // Rank 1 dies.
  m.Touch(0, 120);
  auto again = m.Register(Join(1, 2));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->resume_clock(), 40);
  // A worker rejoining a restarted shard says where it is.
  v1::RegisterRequest rejoin = Join(0, 2, zero->secret());
  rejoin.set_clock(121);
  EXPECT_EQ(m.Register(rejoin)->resume_clock(), 121);
}

TEST(Membership, ASecretBindsARankToItsRegistration) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(5));
  auto zero = m.Register(Join(0));
  auto one = m.Register(Join(1));
  ASSERT_TRUE(zero.ok() && one.ok());
  EXPECT_NE(zero->secret(), 0u);
  EXPECT_NE(zero->secret(), one->secret());
  // Acting as rank 0 takes rank 0's secret; it notes the clock.
  EXPECT_TRUE(m.Authorize(0, zero->secret(), 7).ok());
  EXPECT_EQ(m.MaxClock(), 7);
  absl::Status spoofed = m.Authorize(0, one->secret(), 9);
  EXPECT_EQ(spoofed.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_NE(spoofed.message().find("rank 0"), std::string::npos) << spoofed;
  EXPECT_EQ(m.MaxClock(), 7);  // A refused call notes nothing.
  EXPECT_EQ(m.Authorize(0, 0, 9).code(), absl::StatusCode::kPermissionDenied);
  // A rank no one registered: the shard may have restarted, so the caller
  // is told to wait (its heartbeats register it again).
  Membership fresh(&clock, absl::Seconds(5));
  EXPECT_EQ(fresh.Authorize(1, one->secret(), 1).code(),
            absl::StatusCode::kUnavailable);
  // ... unless it is within the grace after a (re)start, when the job's
  // workers go on while their heartbeats register them again.
  Membership restarted(&clock, absl::Seconds(5), Membership::Resume::kJobFront,
                       0, /*rejoin_grace=*/absl::Seconds(3));
  EXPECT_TRUE(restarted.Authorize(1, one->secret(), 1).ok());
  clock.Advance(absl::Seconds(3));
  EXPECT_EQ(restarted.Authorize(1, one->secret(), 1).code(),
            absl::StatusCode::kUnavailable);
  // Rank -1 (not a worker) reads, and nothing else.
  EXPECT_TRUE(m.Authorize(-1, 0, 0, /*anyone=*/true).ok());
  EXPECT_EQ(m.Authorize(-1, 0, 0).code(), absl::StatusCode::kPermissionDenied);

  // No one else registers as live rank 0 ...
  auto usurper = m.Register(Join(0));
  EXPECT_EQ(usurper.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(usurper.status().message().find("held by a live worker"),
            std::string::npos)
      << usurper.status();
  EXPECT_EQ(m.Register(Join(0, 2, one->secret())).status().code(),
            absl::StatusCode::kUnavailable);
  // ... but rank 0 itself may, and gets a new secret; the old one is void.
  auto again = m.Register(Join(0, 2, zero->secret()));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_NE(again->secret(), zero->secret());
  EXPECT_EQ(m.Authorize(0, zero->secret(), 0).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(m.Authorize(0, again->secret(), 0).ok());
  // Once rank 0 has been silent past the timeout, a replacement takes it.
  clock.Advance(absl::Seconds(6));
  auto replacement = m.Register(Join(0));
  ASSERT_TRUE(replacement.ok()) << replacement.status();
  EXPECT_EQ(m.Authorize(0, again->secret(), 0).code(),
            absl::StatusCode::kPermissionDenied);
}

TEST(Membership, AFixedJobSizeBoundsWhatRegistrationsCanDo) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(5), Membership::Resume::kJobFront,
               /*job_workers=*/2);
  EXPECT_EQ(m.Expected(), 2);
  // With no worker live yet, a job of another size is refused all the same.
  auto other = m.Register(Join(0, 60000));
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find("--num_workers=2"), std::string::npos)
      << other.status();
  ASSERT_TRUE(m.Register(Join(0, 2)).ok());
  ASSERT_TRUE(m.Register(Join(1, 2)).ok());
  // A flood: every size, every rank, asked-for ranks; nothing gets in.
  int refused = 0;
  for (int n = 1; n <= 500; ++n) {
    refused += !m.Register(Join(n % 4 - 1, n)).ok();
  }
  EXPECT_EQ(refused, 500);
  EXPECT_EQ(m.Registered(), 2);
  EXPECT_EQ(m.Expected(), 2);
}

// A restarted shard, or a backup promoted to primary, does not know who is
// in the job until heartbeats register the ranks: each rank of the job it
// has not heard from since is presumed there for --worker_timeout (so a
// bsp step does not complete without it), and none is presumed after.
TEST(Membership, RanksNotHeardSinceARestartArePresumedForTheWorkerTimeout) {
  ManualClock clock;
  Membership m(&clock, absl::Seconds(5));
  EXPECT_EQ(m.Presumed(), -1);  // The job's size is not known yet.
  ASSERT_TRUE(m.Register(Join(0, 3)).ok());
  EXPECT_EQ(m.LiveCount(), 1);
  EXPECT_EQ(m.Presumed(), 2);  // Ranks 1 and 2.
  clock.Advance(absl::Seconds(2));
  ASSERT_TRUE(m.Register(Join(2, 3)).ok());
  EXPECT_EQ(m.Presumed(), 1);
  clock.Advance(absl::Seconds(3.5));
  EXPECT_EQ(m.Presumed(), 0);   // The window is over: rank 1 is not there.
  EXPECT_EQ(m.LiveCount(), 1);  // Rank 0 fell silent meanwhile.

  // Promoted: rank 2 was heard before, rank 0 not for a while; neither is
  // counted twice (rank 2 is live) nor forgotten (rank 0 is presumed).
  m.Restarted();
  EXPECT_EQ(m.LiveCount(), 1);
  EXPECT_EQ(m.Presumed(), 2);  // Ranks 0 and 1.
  m.Touch(0, 7);
  EXPECT_EQ(m.LiveCount(), 2);
  EXPECT_EQ(m.Presumed(), 1);
  clock.Advance(absl::Seconds(5.5));
  EXPECT_EQ(m.Presumed(), 0);

  // A job of known size (--num_workers) is presumed from the start.
  Membership fixed(&clock, absl::Seconds(5), Membership::Resume::kJobFront,
                   /*job_workers=*/4);
  EXPECT_EQ(fixed.Presumed(), 4);
}

}  // namespace
}  // namespace asyncps

namespace asyncps {
namespace {

// Issue #40, a replicated membership: a backup holds its primary's
// registrations (Export/Import), so a promoted backup authorizes every
// worker with the secret it registered with, resumes each rank at its
// clock, and counts the job's workers as live from the promotion
// (Restarted), not as strangers whose heartbeats must register them again.
TEST(Membership, ABackupImportsThePrimarysRegistrations) {
  ManualClock clock;
  Membership primary(&clock, absl::Seconds(2), Membership::Resume::kOwnClock);
  auto a = primary.Register(Join(0));
  auto b = primary.Register(Join(1));
  ASSERT_TRUE(a.ok() && b.ok());
  primary.Touch(0, 7);
  primary.Touch(1, 4);
  v1::HeartbeatRequest leave;
  leave.set_rank(1);
  leave.set_incarnation(b->incarnation());
  leave.set_secret(b->secret());
  leave.set_clock(4);
  leave.set_leaving(true);
  ASSERT_TRUE(primary.Heartbeat(leave).ok());

  Membership backup(&clock, absl::Seconds(2), Membership::Resume::kOwnClock);
  backup.Import(primary.Export());
  clock.Advance(absl::Seconds(5));  // Long past --worker_timeout.
  backup.Restarted();               // Promoted.
  EXPECT_EQ(backup.LiveCount(), 0);
  EXPECT_EQ(backup.Presumed(), 1) << "rank 0 presumed; rank 1 left";
  EXPECT_TRUE(backup.Authorize(0, a->secret(), 8).ok());
  EXPECT_EQ(backup.Authorize(0, b->secret(), 8).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(backup.LiveCount(), 1) << "rank 0 is heard from again";
  EXPECT_EQ(backup.Expected(), 2);
  EXPECT_EQ(backup.Registered(), 2);
  EXPECT_EQ(backup.MaxClock(), 8);
  // A replacement of rank 0 resumes at its clock, and its incarnation is
  // newer than any the primary gave.
  auto again = backup.Register(Join(0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kUnavailable)
      << "a live rank's holder must be silent first";
  clock.Advance(absl::Seconds(3));
  again = backup.Register(Join(0));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->resume_clock(), 8);
  EXPECT_GT(again->incarnation(), b->incarnation());
  // Importing again replaces what was there.
  backup.Import(Membership(&clock, absl::Seconds(2)).Export());
  EXPECT_EQ(backup.Registered(), 0);
}

}  // namespace
}  // namespace asyncps
