// Membership: which workers are in the job, their clocks, and whether each is
// live (heard from within --worker_timeout); and who may act as which rank:
// each registration gets a random secret, which every later call of the
// rank must carry (Authorize). Thread-safe.
#ifndef ASYNCPS_SERVER_MEMBERSHIP_H_
#define ASYNCPS_SERVER_MEMBERSHIP_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/partitioner.h"  // kMaxRank
#include "proto/asyncps.pb.h"

namespace asyncps {

class Membership {
 public:
  // Where a (re)joining worker resumes.
  enum class Resume {
    // One below the highest clock seen, so that in bsp its first gradient
    // contributes to the step in progress (bsp, allreduce).
    kJobFront,
    // Where this rank was when last heard from, so a replacement picks up
    // the dead worker's share of the data where it stopped (async, ssp).
    kOwnClock,
  };
  // `clock` is borrowed and must outlive this object. `job_workers` > 0
  // fixes the job's worker count (ps_server --num_workers): a Register
  // saying otherwise is refused; 0 takes it from the workers.
  // `rejoin_grace`: how long after creation a rank that has not registered
  // may act (see Authorize).
  // `elastic`: workers join and leave while the job trains (ps_server
  // --elastic, docs/ELASTIC.md). A worker may then ask for any rank below
  // kMaxRank and say any num_workers (the size it was started with; the
  // first registration's, or job_workers, is how many a bsp job waits for
  // at its start). One that joins (clock 0) resumes at the job's front and
  // counts in a bsp quorum from the step after it (LiveCount); in async and
  // ssp it resumes at the slowest live worker's clock, so it holds no one
  // back.
  Membership(Clock* clock, absl::Duration worker_timeout,
             Resume resume = Resume::kJobFront, int job_workers = 0,
             absl::Duration rejoin_grace = absl::ZeroDuration(),
             bool elastic = false);

  // Adds or re-adds a worker. rank = -1 gives the lowest rank that is not
  // live; a rank that registers again gets a new incarnation (a restarted
  // worker rejoins) and a resume clock (see Resume); a worker that says it
  // is at a later clock (it registers again with a restarted shard) is
  // taken to be there.
  // Each registration gets a new secret (RegisterResponse.secret). A rank
  // whose worker is live is registered again only if the request carries
  // its secret (the same worker re-joining); anyone else is UNAVAILABLE
  // until that worker has been silent for worker_timeout or has left.
  // INVALID_ARGUMENT for a rank outside [-1, num_workers) or num_workers
  // outside [1, kMaxRank]; FAILED_PRECONDITION for a num_workers other
  // than job_workers, or than the one the job's live workers registered
  // with.
  absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request);

  // Records that the worker is alive at `clock`. NOT_FOUND if the rank never
  // registered; FAILED_PRECONDITION if a newer incarnation has registered;
  // PERMISSION_DENIED without the incarnation's secret.
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);

  // Checks that a call acting as `rank` carries the secret of the rank's
  // registration, then notes `clock` as Touch does. Rank -1 (a client that
  // is not a training worker, e.g. the evaluator) passes only if `anyone`
  // (reads, which the auth token guards). A rank that has not registered
  // here passes within rejoin_grace of this object's creation (a shard
  // that restarted lets its workers go on while their heartbeats register
  // them again), and is UNAVAILABLE after; PERMISSION_DENIED for a wrong
  // secret, or rank -1 where only a worker may act.
  absl::Status Authorize(int rank, uint64_t secret, int64_t clock,
                         bool anyone = false);

  // Notes the clock a worker reports on a pull or push (rank < 0 ignored),
  // without Authorize's check (in-process callers).
  void Touch(int rank, int64_t clock);
  // Counts a push of `rank` refused for a NaN or Inf value (WorkerInfo's
  // nonfinite_pushes; rank < 0 or one not registered here is ignored).
  void NoteNonFinite(int rank);

  std::vector<v1::WorkerInfo> Workers() const;

  // The highest progress.steps_per_second among the live workers that have
  // not left, as their last heartbeats said; 0 if none said one.
  double FastestStepsPerSecond() const;

  // Live workers now, and the lowest and highest clock among them (0 if
  // none is live). An elastic job's LiveCount leaves out the workers that
  // joined for the step after the front (they do not send the step in
  // progress): it is a bsp step's quorum.
  int LiveCount() const;
  // The live ranks, ascending (those LiveCount leaves out too): an elastic
  // job's workers split the data by their place among them.
  std::vector<int> LiveRanks() const;
  bool elastic() const { return elastic_; }
  // While some rank below the job's starting size (Expected) has never
  // registered: that size (RegisterResponse.start_size); 0 after.
  int StartSize() const;
  int64_t MinLiveClock() const;
  // Ranks presumed in the job though not live here: a shard that (re)started
  // or was promoted to primary does not know who is there until heartbeats
  // register the ranks, so for --worker_timeout after it each rank of the
  // job (in [0, Expected()); elastic, the live ranks the first worker to
  // register again knew of, RegisterRequest.known_live) that is not live
  // and has not been heard from since is counted, and none after. -1 within
  // that window while the job's size is unknown (no worker has registered): any
  // number may be there. A bsp step's quorum is the live ranks plus these.
  int Presumed() const;
  // Starts that window again now: a backup promoted to primary (the job's
  // workers registered with the old primary), also for rejoin_grace.
  void Restarted();
  // The registrations (ranks, incarnations, secrets, clocks, who left) and
  // the job's size, as a replicated shard's primary streams them; and a
  // backup's copy replaced by them (each worker heard from now; a backup
  // hears from a worker again with each of its pushes streamed to it,
  // Touch). A rank that left is not presumed (Presumed).
  v1::MembershipState Export() const;
  void Import(const v1::MembershipState& state);
  // The job's front as this shard's state knows it (bsp: the last step its
  // slices applied), for a shard whose members' clocks are not known (a
  // backup promoted: the membership is not replicated; a restart from a
  // checkpoint): a replacement registering before the others report
  // resumes there, not at 0, and does not redo the job's steps.
  void NoteJobFront(int64_t clock);
  // Highest clock any worker, live or not, has reported.
  int64_t MaxClock() const;
  // Each rank's steps completed, as its registration and heartbeats said
  // (not its pushes and pulls, whose clock is the step in progress): it
  // sends nothing more of those (NotSending.done).
  absl::flat_hash_map<int, int64_t> DoneSteps() const;
  // Workers the job expects (the num_workers its workers registered with) and
  // ranks that have registered so far, live or not.
  int Expected() const;
  int Registered() const;
  // Whether the job is done here: it expects N workers, and ranks 0..N-1
  // have all registered and left cleanly (finished). A shard that restarted
  // after a worker finished does not know it did, and waits for it. An
  // elastic job is not done while any worker is live.
  bool AllFinished() const;
  // The largest gap between the clocks of two live workers seen so far.
  int64_t MaxClockGap() const;

  // Ranks whose liveness changed since the last call.
  struct LivenessChange {
    int rank;
    bool live;
    bool left;  // Not live because it said it was leaving (not silence).
  };
  std::vector<LivenessChange> LivenessChanges();

 private:
  struct Worker {
    bool was_live = false;  // As last reported by LivenessChanges.
    int64_t attempt = 0;    // Registrations since max_clock_ last advanced.
    bool left = false;      // Said it was leaving; live again on Register.
    int64_t incarnation = 0;
    uint64_t secret = 0;  // Of the current incarnation; never 0 once set.
    int64_t clock = 0;
    // The steps this incarnation said it completed (registration,
    // heartbeats): every share it had of them was sent, none will be again.
    int64_t done = 0;
    // An elastic job's first bsp step this incarnation sends (LiveCount).
    int64_t first_step = 0;
    // Pushes refused for a NaN or Inf: here, and by the worker itself (as
    // its heartbeats last said, this incarnation).
    int64_t nonfinite = 0;
    int64_t reported_nonfinite = 0;
    absl::Time last_nonfinite;
    absl::Time last_heard;
    std::string host;
    v1::WorkerProgress progress;
  };
  bool Live(const Worker& w, absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  void TouchLocked(Worker* w, int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Register's checks of the request alone: INVALID_ARGUMENT for a bad
  // num_workers, rank or clock, FAILED_PRECONDITION against --num_workers.
  absl::Status CheckRegister(const v1::RegisterRequest& request) const;
  // The ranks a registration may have: [0, num_workers), or in an elastic
  // job [0, kMaxRank).
  int RankLimit(const v1::RegisterRequest& request) const {
    return elastic_ ? kMaxRank : request.num_workers();
  }
  // The rank a registration gets: its own, or for -1 the lowest not live
  // (RESOURCE_EXHAUSTED if every one is).
  absl::StatusOr<int> RankFor(const v1::RegisterRequest& request,
                              absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Where a registration of `rank` resumes (see Resume and `elastic`);
  // `own`: the clock the rank had here (0 if new).
  int64_t ResumeFor(const v1::RegisterRequest& request, int rank, int64_t own,
                    absl::Time now) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The ranks live now, ascending.
  std::vector<int> LiveRanksLocked(absl::Time now) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The lowest clock among the live workers other than `except` (nullopt:
  // none is live).
  std::optional<int64_t> MinLiveClockLocked(absl::Time now,
                                            int except = -1) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  int StartSizeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration worker_timeout_;
  const Resume resume_;
  const int job_workers_;
  const absl::Duration rejoin_grace_;
  const bool elastic_;

  mutable absl::Mutex mu_;
  // This object's creation, or the last Restarted().
  absl::Time started_ ABSL_GUARDED_BY(mu_);
  // Elastic: the live ranks the first worker to register since started_
  // knew of (RegisterRequest.known_live), presumed in the job instead of
  // [0, expected_); empty: none told yet.
  std::vector<int> presumed_ranks_ ABSL_GUARDED_BY(mu_);
  std::map<int, Worker> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_incarnation_ ABSL_GUARDED_BY(mu_) = 1;
  int64_t max_gap_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t max_clock_ ABSL_GUARDED_BY(mu_) = 0;  // Ever reported; only grows.
  void NoteClock(int64_t clock) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's worker count: set by the first Register, changed only by one
  // made while no worker is live (a new job on the same servers).
  int expected_ ABSL_GUARDED_BY(mu_) = 0;
  int expected_from_rank_ ABSL_GUARDED_BY(mu_) = -1;
  void UpdateGap(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_MEMBERSHIP_H_
