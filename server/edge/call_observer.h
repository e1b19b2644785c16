// What each served call cost, as the shard's transports see it: the seam
// between the request path (gRPC service, data plane) and the metrics. It
// extends the core's HeldPullObserver, through which Consistency reports
// its held pulls without knowing the edge.
#ifndef ASYNCPS_SERVER_EDGE_CALL_OBSERVER_H_
#define ASYNCPS_SERVER_EDGE_CALL_OBSERVER_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "server/held_pull_observer.h"

namespace asyncps {

// Implementations are thread-safe: calls end on many threads at once.
class CallObserver : public HeldPullObserver {
 public:
  // One call of `method` ("Push", "Pull", ...) over `transport` ("grpc" or
  // "tcp") ended with `code` after `took`, having read `received` and
  // written `sent` bytes of messages.
  virtual void CallEnded(absl::string_view transport, absl::string_view method,
                         absl::StatusCode code, absl::Duration took,
                         int64_t received, int64_t sent) = 0;
};

// Tells each of several observers in turn. Add them all before the first
// call; thread-safe after.
class CallObservers final : public CallObserver {
 public:
  // `o` is borrowed and must outlive this; null is ignored.
  void Add(CallObserver* o) {
    if (o != nullptr) observers_.push_back(o);
  }
  bool empty() const { return observers_.empty(); }

  void CallEnded(absl::string_view transport, absl::string_view method,
                 absl::StatusCode code, absl::Duration took, int64_t received,
                 int64_t sent) override {
    for (CallObserver* o : observers_) {
      o->CallEnded(transport, method, code, took, received, sent);
    }
  }
  void HeldPullAnswered(int rank, absl::Duration waited) override {
    for (CallObserver* o : observers_) o->HeldPullAnswered(rank, waited);
  }

 private:
  std::vector<CallObserver*> observers_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_CALL_OBSERVER_H_
