// The shard's per-call metrics (ps_server --metrics_port): calls, bytes and
// latency by method, transport and status code, and how long held pulls
// wait. Fed by both transports as a CallObserver (gRPC through
// server/edge/call_interceptor.h). Thread-safe.
#ifndef ASYNCPS_SERVER_EDGE_RPC_METRICS_H_
#define ASYNCPS_SERVER_EDGE_RPC_METRICS_H_

#include <memory>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/edge/call_observer.h"

namespace asyncps {

class RpcMetrics final : public CallObserver {
 public:
  RpcMetrics();

  // What a scrape collects.
  std::shared_ptr<prometheus::Registry> registry() const { return registry_; }

  void CallEnded(absl::string_view transport, absl::string_view method,
                 absl::StatusCode code, absl::Duration took, int64_t received,
                 int64_t sent) override;
  void HeldPullAnswered(int rank, absl::Duration waited) override;

 private:
  // Constant after construction (the families lock themselves).
  const std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& calls_;
  prometheus::Family<prometheus::Histogram>& seconds_;
  prometheus::Family<prometheus::Counter>& received_;
  prometheus::Family<prometheus::Counter>& sent_;
  prometheus::Histogram& held_wait_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_RPC_METRICS_H_
