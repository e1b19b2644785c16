// Metric families built by hand, for values read at scrape time (a shard's
// Stats, a client's traffic, NVML): prometheus-cpp's own Counter and Gauge
// hold values pushed into them, these are read when asked.
#ifndef ASYNCPS_COMMON_METRIC_FAMILIES_H_
#define ASYNCPS_COMMON_METRIC_FAMILIES_H_

#include <string>
#include <utility>
#include <vector>

#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace asyncps {

// An empty family (samples are added to .metric).
inline prometheus::MetricFamily Family(std::string name, std::string help,
                                       prometheus::MetricType type) {
  prometheus::MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

// One counter or gauge sample of `value` with `labels`.
inline prometheus::ClientMetric Sample(
    prometheus::MetricType type, double value,
    std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::ClientMetric m;
  m.label = std::move(labels);
  if (type == prometheus::MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  return m;
}

// A family of one sample.
inline prometheus::MetricFamily OneSample(
    std::string name, std::string help, prometheus::MetricType type,
    double value, std::vector<prometheus::ClientMetric::Label> labels = {}) {
  prometheus::MetricFamily f = Family(std::move(name), std::move(help), type);
  f.metric.push_back(Sample(type, value, std::move(labels)));
  return f;
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_METRIC_FAMILIES_H_
