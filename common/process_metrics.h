// The metrics every asyncps process serves on its /metrics beside its own:
// Prometheus' standard process_* series (CPU seconds, resident and virtual
// memory, open and maximum file descriptors, start time), read from /proc
// at scrape time, and asyncps_build_info{version,commit} 1. MetricsEndpoint
// registers them itself. Linux only (elsewhere the process_* series are
// absent).
#ifndef ASYNCPS_COMMON_PROCESS_METRICS_H_
#define ASYNCPS_COMMON_PROCESS_METRICS_H_

#include <cstdint>
#include <vector>

#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace asyncps {

class ProcessMetrics final : public prometheus::Collectable {
 public:
  std::vector<prometheus::MetricFamily> Collect() const override;
};

// This process's resident memory (/proc/self/statm), and the memory limit
// of its cgroup (v2 memory.max, or v1 memory.limit_in_bytes: what a
// container's OOM killer enforces); 0 when unknown or unlimited.
uint64_t ResidentBytes();
uint64_t CgroupMemoryLimitBytes();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PROCESS_METRICS_H_
