// Writes what the shard serves into its timeline (ps_server --timeline):
// each call as a span on the thread that served it (a data-plane
// connection has a thread of its own, so a row per worker connection), and
// each held pull's wait on a row of its own per rank. Thread-safe.
#ifndef ASYNCPS_SERVER_EDGE_CALL_TIMELINE_H_
#define ASYNCPS_SERVER_EDGE_CALL_TIMELINE_H_

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/synchronization/mutex.h"
#include "common/timeline.h"
#include "server/edge/call_observer.h"

namespace asyncps {

class CallTimeline final : public CallObserver {
 public:
  // `timeline` is borrowed and must outlive this.
  explicit CallTimeline(Timeline* timeline) : timeline_(timeline) {}

  void CallEnded(absl::string_view transport, absl::string_view method,
                 absl::StatusCode code, absl::Duration took, int64_t received,
                 int64_t sent) override;
  void HeldPullAnswered(int rank, absl::Duration waited) override;

  // The lane of rank `rank`'s held pulls: past any thread id (Linux's
  // pid_max is at most 2^22).
  static int HeldLane(int rank) { return (1 << 22) + 1 + rank; }

 private:
  Timeline* const timeline_;
  absl::Mutex mu_;
  absl::flat_hash_set<int> named_ ABSL_GUARDED_BY(mu_);  // Lanes named.
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_CALL_TIMELINE_H_
