// A shard's Prometheus metrics (ps_server --metrics_port): everything the
// Stats RPC reports, read at scrape time (no work on the request path),
// named by Prometheus' conventions (asyncps_shard_..._total for counters).
// Thread-safe.
#ifndef ASYNCPS_SERVER_EDGE_METRICS_H_
#define ASYNCPS_SERVER_EDGE_METRICS_H_

#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "proto/asyncps.pb.h"
#include "server/edge/shard_stats.h"

namespace asyncps {

// The metric families of one Stats answer (tests read them directly).
std::vector<prometheus::MetricFamily> StatsToMetrics(
    const v1::StatsResponse& stats);

class ShardMetrics final : public prometheus::Collectable {
 public:
  explicit ShardMetrics(ShardParts parts) : parts_(parts) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    return StatsToMetrics(CollectStats(parts_));
  }

 private:
  const ShardParts parts_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_METRICS_H_
