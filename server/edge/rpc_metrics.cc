#include "server/edge/rpc_metrics.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

// Seconds, from 100 µs to about 100 s, four buckets per decade.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* b = [] {
    auto* b = new prometheus::Histogram::BucketBoundaries;
    for (double s = 1e-4; s < 150; s *= 1.778279) b->push_back(s);
    return b;
  }();
  return *b;
}

}  // namespace

RpcMetrics::RpcMetrics()
    : registry_(std::make_shared<prometheus::Registry>()),
      calls_(prometheus::BuildCounter()
                 .Name("asyncps_shard_calls_total")
                 .Help("Calls served, by method, transport (grpc, tcp: the "
                       "data plane) and status code.")
                 .Register(*registry_)),
      seconds_(prometheus::BuildHistogram()
                   .Name("asyncps_shard_call_duration_seconds")
                   .Help("Time from a call's arrival to its answer (held "
                         "pulls included), by method and transport.")
                   .Register(*registry_)),
      received_(prometheus::BuildCounter()
                    .Name("asyncps_shard_received_bytes_total")
                    .Help("Request bytes received, by method and transport.")
                    .Register(*registry_)),
      sent_(prometheus::BuildCounter()
                .Name("asyncps_shard_sent_bytes_total")
                .Help("Answer bytes sent, by method and transport.")
                .Register(*registry_)),
      held_wait_(prometheus::BuildHistogram()
                     .Name("asyncps_shard_held_pull_wait_seconds")
                     .Help("ssp/bsp: how long each held pull waited for the "
                           "slowest worker (ssp) or its step (bsp).")
                     .Register(*registry_)
                     .Add({}, LatencyBuckets())) {}

void RpcMetrics::CallEnded(absl::string_view transport,
                           absl::string_view method, absl::StatusCode code,
                           absl::Duration took, int64_t received,
                           int64_t sent) {
  const std::string t(transport), m(method);
  calls_
      .Add({{"method", m},
            {"transport", t},
            {"code", absl::StatusCodeToString(code)}})
      .Increment();
  seconds_.Add({{"method", m}, {"transport", t}}, LatencyBuckets())
      .Observe(absl::ToDoubleSeconds(took));
  if (received > 0) {
    received_.Add({{"method", m}, {"transport", t}})
        .Increment(static_cast<double>(received));
  }
  if (sent > 0) {
    sent_.Add({{"method", m}, {"transport", t}})
        .Increment(static_cast<double>(sent));
  }
}

void RpcMetrics::HeldPullAnswered(int /*rank*/, absl::Duration waited) {
  held_wait_.Observe(absl::ToDoubleSeconds(waited));
}

}  // namespace asyncps
