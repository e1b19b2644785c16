// Consistency: the server side of --mode. Decides how a push is applied
// (async, ssp: on arrival, with the stale policy; bsp: averaged per step
// over the live workers, less backup workers, once the expected workers
// have all joined) and whether a pull is answered
// now or held (ssp: until the puller is within `staleness` clocks of the
// slowest live worker, workers expected but not yet registered counting as
// clock 0; bsp: until the puller's step is applied). Tick(),
// which the server calls on a period, re-checks held pulls, applies bsp steps
// whose stragglers died or missed --step_deadline, and logs workers that go
// silent or come back. No gRPC here: held pulls are PendingCalls.
// Thread-safe.
#ifndef ASYNCPS_SERVER_CONSISTENCY_H_
#define ASYNCPS_SERVER_CONSISTENCY_H_

#include <atomic>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mode.h"
#include "proto/asyncps.pb.h"
#include "server/held_calls.h"
#include "server/membership.h"
#include "server/shard_store.h"

namespace asyncps {

struct ConsistencyConfig {
  Mode mode = Mode::kAsync;
  int64_t staleness = 0;   // ssp.
  int backup_workers = 0;  // bsp: a step needs live - backup_workers.
  absl::Duration step_deadline = absl::ZeroDuration();  // bsp; 0: none.
  StalePolicy stale;                                    // async, ssp.

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

class Consistency {
 public:
  // `store`, `membership`, `clock` are borrowed and must outlive this.
  Consistency(ConsistencyConfig config, ShardStore* store,
              Membership* membership, Clock* clock);
  ~Consistency() { Shutdown(); }

  // Answers `call` with `request`'s weights in `*response` now, or holds it
  // until it may be answered (or its deadline passes: DEADLINE_EXCEEDED).
  // `request` and `response` must stay valid until the call is answered.
  void Pull(const v1::PullRequest& request, v1::PullResponse* response,
            PendingCall call);
  absl::Status Push(const v1::PushRequest& request, v1::PushResponse* response);
  // Push, then Pull of the pushed slices in `request.weights_dtype()`; on
  // a push error `call` is answered with it and nothing was applied.
  // `request` and `response` must stay valid until the call is answered.
  void PushPull(const v1::PushPullRequest& request,
                v1::PushPullResponse* response, PendingCall call);
  // A worker's clock moved (heartbeat): held pulls may go.
  void ClockAdvanced() { Recheck(); }

  // The server's housekeeping, called on a period: logs liveness changes,
  // applies bsp steps that may go, answers held pulls that may go or whose
  // deadline passed.
  void Tick();
  // Answers every held pull, and every later one that would be held, with
  // UNAVAILABLE (clients retry). Call before the transport shuts down.
  void Shutdown();

  const ConsistencyConfig& config() const { return config_; }
  // Pulls held since the start, and held now.
  int64_t held_pulls() const { return held_total_.load(); }
  size_t waiting() { return waiters_.size(); }

 private:
  struct Wait {
    const v1::PullRequest* request;
    v1::PullResponse* response;
    std::vector<int> slices;
  };
  bool Ready(const Wait& w) const;
  int Quorum(int live) const;
  // Answers every held pull that may go, or whose deadline passed.
  void Recheck();

  // Constant after construction.
  const ConsistencyConfig config_;
  ShardStore* const store_;
  Membership* const membership_;
  Clock* const clock_;

  std::atomic<int64_t> held_total_{0};
  HeldCalls<Wait> waiters_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CONSISTENCY_H_
