// What the client-library tests (client_api_test.cc,
// client_compress_test.cc) share: a client's options for a TestCluster, a
// model of two tensors, plain SGD, and the spans the API takes.
#ifndef ASYNCPS_TESTS_INTEGRATION_CLIENT_API_H_
#define ASYNCPS_TESTS_INTEGRATION_CLIENT_API_H_

#include <string>
#include <vector>

#include "absl/types/span.h"
#include "asyncps/client.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {

// Rank `rank` of `num_workers` on every shard of `cluster`, in small
// slices (16 bytes) so that tensors spread over the shards.
inline ClientOptions Options(const TestCluster& cluster, int rank,
                             int num_workers,
                             const std::string& mode = "async") {
  ClientOptions o;
  for (const ServerAddress& s : cluster.servers())
    o.servers.push_back(s.ToString());
  o.rank = rank;
  o.num_workers = num_workers;
  o.mode = mode;
  o.retry_for_seconds = 10;
  o.slice_bytes = 16;  // Small slices: tensors spread over both shards.
  return o;
}

inline const std::vector<TensorSpec> kModel = {{"layer.w", {2, 3}},
                                               {"layer.b", {3}}};

inline OptimizerOptions Sgd(float lr) {
  OptimizerOptions o;
  o.kind = "sgd";
  o.learning_rate = lr;
  return o;
}

inline std::vector<absl::Span<const float>> In(
    const std::vector<std::vector<float>>& v) {
  return {v.begin(), v.end()};
}

inline std::vector<absl::Span<float>> Out(std::vector<std::vector<float>>* v) {
  std::vector<absl::Span<float>> out;
  for (auto& x : *v) out.push_back(absl::MakeSpan(x));
  return out;
}

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_CLIENT_API_H_
