// MembershipClient: a training worker's membership in the job. Join
// registers with every shard (checking that they run the worker's mode) and
// learns the clock to resume from; a heartbeat thread then reports the
// worker's clock every period and registers again with a shard that
// restarted and forgot it; Leave stops the thread and tells every shard the
// worker is done, so ssp and bsp stop waiting for it. Thread-safe.
#ifndef ASYNCPS_CLIENT_MEMBERSHIP_CLIENT_H_
#define ASYNCPS_CLIENT_MEMBERSHIP_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "client/shard_caller.h"
#include "common/mode.h"

namespace asyncps {

class MembershipClient {
 public:
  // Registers `rank` of `num_workers` with every shard of `client`
  // (borrowed; must outlive this) and starts heartbeating every
  // `heartbeat_every`. FAILED_PRECONDITION if a shard runs another mode.
  // Rank -1: shard 0 assigns one (the lowest not live; RESOURCE_EXHAUSTED
  // when every rank is), which every other shard is then told.
  static absl::StatusOr<std::unique_ptr<MembershipClient>> Join(
      ShardCaller* client, int rank, int num_workers, Mode mode,
      absl::Duration heartbeat_every);
  // Leaves, if Leave was not called.
  ~MembershipClient();

  // The job's clock when this worker joined.
  int64_t start_clock() const { return start_clock_; }
  // This worker's rank (as assigned, if it asked for -1).
  int rank() const { return join_.rank(); }
  // The worker's clock (steps completed), which heartbeats report; the
  // trainer advances it.
  std::atomic<int64_t>* clock() { return &clock_; }

  // What the next heartbeats report of this worker's progress.
  void Report(const v1::WorkerProgress& progress) {
    absl::MutexLock lock(&mu_);
    progress_ = progress;
  }

  // Counts a push refused for a NaN or Inf gradient (heartbeats report
  // the count: WorkerProgress.nonfinite_pushes).
  void CountNonFinite() { nonfinite_.fetch_add(1); }

  // What the last heartbeat answered of the job's fastest worker
  // (HeartbeatResponse.fastest_steps_per_second; 0 before one).
  double fastest_steps_per_second() const { return fastest_.load(); }

  // The ranks live now as shard 0 last said (its answer to the
  // registration, then to each heartbeat), ascending, and whether the job
  // is elastic (ps_server --elastic).
  std::vector<int> live_ranks() const {
    absl::MutexLock lock(&mu_);
    return live_ranks_;
  }
  bool elastic() const { return elastic_; }
  // As shard 0 last said (RegisterResponse.start_size): the job's starting
  // size while its first workers are still registering, else 0.
  int start_size() const { return start_size_.load(); }

  // Stops heartbeating and says, with the final clock, that this worker is
  // leaving. Idempotent.
  void Leave();

 private:
  MembershipClient(ShardCaller* client, v1::RegisterRequest join,
                   absl::Duration heartbeat_every);
  absl::Status Heartbeat(int shard, bool leaving);
  // Keeps what shard 0 answered (a RegisterResponse or HeartbeatResponse)
  // of who is live and the job's start size.
  template <typename Response>
  void NoteMembers(const Response& r) {
    absl::MutexLock lock(&mu_);
    live_ranks_.assign(r.live_ranks().begin(), r.live_ranks().end());
    start_size_.store(r.start_size());
  }
  // The join request again, saying where this worker is now: its clock may
  // be ahead of its last heartbeat (a restarted shard).
  v1::RegisterRequest Again() const;
  void HeartbeatLoop();

  ShardCaller* const client_;
  const v1::RegisterRequest join_;
  const absl::Duration heartbeat_every_;
  int64_t start_clock_ = 0;
  std::atomic<int64_t> clock_{0};
  std::atomic<double> fastest_{0};
  std::atomic<int64_t> nonfinite_{0};
  bool elastic_ = false;
  std::atomic<int> start_size_{0};
  mutable absl::Mutex mu_;
  std::vector<int64_t> incarnations_ ABSL_GUARDED_BY(mu_);
  std::vector<int> live_ranks_ ABSL_GUARDED_BY(mu_);
  v1::WorkerProgress progress_ ABSL_GUARDED_BY(mu_);
  absl::Notification stop_;
  std::thread heartbeat_;
  bool left_ = false;  // Touched by the owner's thread only.
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_MEMBERSHIP_CLIENT_H_
