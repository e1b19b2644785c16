// A GPU worker's device metrics from NVML (the library nvidia-smi and DCGM
// read): utilisation and memory, read at scrape time. NVML comes with the
// NVIDIA driver, not with the CUDA toolkit or Debian's main archive, so it
// is opened at run time (dlopen of libnvidia-ml.so.1) rather than linked:
// the same binary runs where there is no driver, without these metrics.
// Thread-safe.
#ifndef ASYNCPS_WORKER_GPU_METRICS_H_
#define ASYNCPS_WORKER_GPU_METRICS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"

namespace asyncps {

class GpuMetrics final : public prometheus::Collectable {
 public:
  // NVML's device `index` (as CUDA's when CUDA_DEVICE_ORDER=PCI_BUS_ID).
  // UNAVAILABLE, saying why, without the driver's NVML or that device.
  static absl::StatusOr<std::shared_ptr<GpuMetrics>> Open(int index);
  ~GpuMetrics() override;

  std::vector<prometheus::MetricFamily> Collect() const override;

  struct Api;  // NVML's entry points, as resolved.

 private:
  GpuMetrics(std::unique_ptr<Api> api, void* device, int index);

  const std::unique_ptr<Api> api_;
  void* const device_;  // nvmlDevice_t.
  const std::string index_;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_GPU_METRICS_H_
