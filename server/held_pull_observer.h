// What the core tells the edge as each held pull (an ssp clock, a bsp step)
// is answered: the one seam through which Consistency reports to the
// metrics and the call timeline (server/edge/call_observer.h) without
// knowing them. The core defines it and the edge implements it, so the
// arrow points down only (docs/DESIGN.md, "Inside server/").
#ifndef ASYNCPS_SERVER_HELD_PULL_OBSERVER_H_
#define ASYNCPS_SERVER_HELD_PULL_OBSERVER_H_

#include "absl/time/time.h"

namespace asyncps {

// Implementations are thread-safe: pulls are answered on many threads.
class HeldPullObserver {
 public:
  virtual ~HeldPullObserver() = default;

  // Rank `rank`'s held pull (ssp clock, bsp step) was answered after
  // waiting `waited`.
  virtual void HeldPullAnswered(int rank, absl::Duration waited) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_HELD_PULL_OBSERVER_H_
