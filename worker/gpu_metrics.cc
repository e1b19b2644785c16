#include "worker/gpu_metrics.h"

#include <dlfcn.h>

#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metric_families.h"

namespace asyncps {
namespace {

// The parts of NVML's C ABI used here (nvml.h, stable since NVML 2.285):
// results are ints (0: NVML_SUCCESS), devices opaque pointers.
struct Utilization {
  unsigned int gpu;     // Percent of time a kernel ran, last sample period.
  unsigned int memory;  // Percent of time memory was read or written.
};
struct Memory {
  unsigned long long total;  // NOLINT(runtime/int): NVML's own types.
  unsigned long long free;   // NOLINT(runtime/int)
  unsigned long long used;   // NOLINT(runtime/int)
};

prometheus::MetricFamily Gauge(const char* name, const char* help,
                               const std::string& index, double value) {
  return OneSample(name, help, prometheus::MetricType::Gauge, value,
                   {{"gpu", index}});
}

}  // namespace

struct GpuMetrics::Api {
  void* library = nullptr;
  int (*init)() = nullptr;
  int (*shutdown)() = nullptr;
  int (*handle_by_index)(unsigned int, void**) = nullptr;
  int (*utilization)(void*, Utilization*) = nullptr;
  int (*memory)(void*, Memory*) = nullptr;
  const char* (*error_string)(int) = nullptr;
};

absl::StatusOr<std::shared_ptr<GpuMetrics>> GpuMetrics::Open(int index) {
  auto api = std::make_unique<Api>();
  api->library = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (api->library == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "no NVML (libnvidia-ml.so.1, from the NVIDIA driver): ", dlerror()));
  }
  auto resolve = [&api](auto* fn, const char* name) {
    *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(
        dlsym(api->library, name));
    return *fn != nullptr;
  };
  if (!resolve(&api->init, "nvmlInit_v2") ||
      !resolve(&api->shutdown, "nvmlShutdown") ||
      !resolve(&api->handle_by_index, "nvmlDeviceGetHandleByIndex_v2") ||
      !resolve(&api->utilization, "nvmlDeviceGetUtilizationRates") ||
      !resolve(&api->memory, "nvmlDeviceGetMemoryInfo") ||
      !resolve(&api->error_string, "nvmlErrorString")) {
    dlclose(api->library);
    return absl::UnavailableError("libnvidia-ml.so.1 lacks an NVML call");
  }
  if (int r = api->init(); r != 0) {
    const std::string why = api->error_string(r);
    dlclose(api->library);
    return absl::UnavailableError(absl::StrCat("nvmlInit: ", why));
  }
  void* device = nullptr;
  if (int r = api->handle_by_index(static_cast<unsigned int>(index), &device);
      r != 0) {
    const std::string why = api->error_string(r);
    api->shutdown();
    dlclose(api->library);
    return absl::UnavailableError(
        absl::StrCat("NVML device ", index, ": ", why));
  }
  return std::shared_ptr<GpuMetrics>(
      new GpuMetrics(std::move(api), device, index));
}

GpuMetrics::GpuMetrics(std::unique_ptr<Api> api, void* device, int index)
    : api_(std::move(api)), device_(device), index_(absl::StrCat(index)) {}

GpuMetrics::~GpuMetrics() {
  api_->shutdown();
  dlclose(api_->library);
}

std::vector<prometheus::MetricFamily> GpuMetrics::Collect() const {
  std::vector<prometheus::MetricFamily> out;
  Utilization u{};
  if (api_->utilization(device_, &u) == 0) {
    out.push_back(Gauge("asyncps_gpu_utilization_ratio",
                        "Share of the last sample period a kernel ran on the "
                        "worker's GPU (NVML).",
                        index_, u.gpu / 100.0));
    out.push_back(Gauge("asyncps_gpu_memory_busy_ratio",
                        "Share of the last sample period the GPU's memory was "
                        "read or written (NVML).",
                        index_, u.memory / 100.0));
  }
  Memory m{};
  if (api_->memory(device_, &m) == 0) {
    out.push_back(Gauge("asyncps_gpu_memory_used_bytes",
                        "GPU memory in use, all processes (NVML).", index_,
                        static_cast<double>(m.used)));
    out.push_back(Gauge("asyncps_gpu_memory_total_bytes",
                        "GPU memory on the device (NVML).", index_,
                        static_cast<double>(m.total)));
  }
  return out;
}

}  // namespace asyncps
