// Consistency: the server side of --mode. Decides how a push is applied
// (async, ssp: on arrival, with the stale policy; bsp: averaged per step
// over the live workers, less backup workers, once the expected workers
// have all joined) and whether a pull is answered
// now or held (ssp: until the puller is within `staleness` clocks of the
// slowest live worker; bsp: until the puller's step is applied). A ticker
// re-checks held pulls, applies bsp steps whose stragglers died or missed
// --step_deadline, and logs workers that go silent or come back.
// Thread-safe.
#ifndef ASYNCPS_SERVER_CONSISTENCY_H_
#define ASYNCPS_SERVER_CONSISTENCY_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mode.h"
#include "proto/asyncps.pb.h"
#include "server/membership.h"
#include "server/shard_store.h"

namespace asyncps {

struct ConsistencyConfig {
  Mode mode = Mode::kAsync;
  int64_t staleness = 0;   // ssp.
  int backup_workers = 0;  // bsp: a step needs live - backup_workers.
  absl::Duration step_deadline = absl::ZeroDuration();  // bsp; 0: none.
  StalePolicy stale;                                    // async, ssp.
  absl::Duration tick = absl::Milliseconds(20);
};

class Consistency {
 public:
  // `store`, `membership`, `clock` are borrowed and must outlive this.
  Consistency(ConsistencyConfig config, ShardStore* store,
              Membership* membership, Clock* clock);
  ~Consistency();

  // Answers `request` through `reactor` now, or holds it until it may be
  // answered (or its deadline passes: DEADLINE_EXCEEDED).
  void Pull(grpc::CallbackServerContext* context,
            const v1::PullRequest* request, v1::PullResponse* response,
            grpc::ServerUnaryReactor* reactor);
  absl::Status Push(const v1::PushRequest& request, v1::PushResponse* response);
  // A worker's clock moved (heartbeat): held pulls may go.
  void ClockAdvanced() { Recheck(); }

  // Runs `hook` on every tick (e.g. expiring other held calls).
  void AddTickHook(std::function<void(absl::Time)> hook);
  // Answers every held pull with UNAVAILABLE (clients retry) and stops the
  // ticker. Call before grpc::Server::Shutdown.
  void Shutdown();

  const ConsistencyConfig& config() const { return config_; }
  int64_t held_pulls() const { return held_total_.load(); }

 private:
  struct Waiter {
    grpc::CallbackServerContext* context;
    const v1::PullRequest* request;
    v1::PullResponse* response;
    grpc::ServerUnaryReactor* reactor;
    std::vector<int> slices;
  };
  bool Ready(const Waiter& w) const;
  int Quorum(int live) const;
  // Finishes every held pull that may go, or whose deadline passed.
  void Recheck();
  void TickLoop();

  const ConsistencyConfig config_;
  ShardStore* const store_;
  Membership* const membership_;
  Clock* const clock_;

  absl::Mutex mu_;
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void(absl::Time)>> hooks_ ABSL_GUARDED_BY(mu_);
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<int64_t> held_total_{0};
  absl::Notification stop_;
  std::thread ticker_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CONSISTENCY_H_
