// GpuMetrics opens NVML at run time: where the NVIDIA driver is (a GPU
// machine) it reports device 0's memory; where it is not (this project's
// development machines) Open says why, and the worker goes on without GPU
// metrics.
#include "worker/gpu_metrics.h"

#include <string>

#include "gtest/gtest.h"

namespace asyncps {
namespace {

TEST(GpuMetrics, ReportsTheDeviceOrSaysWhyNot) {
  auto gpu = GpuMetrics::Open(0);
  if (!gpu.ok()) {
    EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_NE(gpu.status().message().find("NVML"), std::string::npos)
        << gpu.status();
    GTEST_SKIP() << "no NVIDIA driver here: " << gpu.status();
  }
  double total = 0;
  for (const auto& f : (*gpu)->Collect()) {
    if (f.name == "asyncps_gpu_memory_total_bytes") {
      total = f.metric.at(0).gauge.value;
    }
  }
  EXPECT_GT(total, 1 << 30) << "a GPU with under 1 GiB?";
}

TEST(GpuMetrics, ADeviceThatIsNotThereIsUnavailable) {
  auto gpu = GpuMetrics::Open(4096);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable);
}

}  // namespace
}  // namespace asyncps
