// What the PsExchange tests (ps_exchange_test.cc, ps_exchange_bsp_test.cc)
// share: the initial weight and SGD learning rate of their models, and a
// worker's client options for in-process shards.
#ifndef ASYNCPS_TESTS_INTEGRATION_PS_EXCHANGE_JOB_H_
#define ASYNCPS_TESTS_INTEGRATION_PS_EXCHANGE_JOB_H_

#include "asyncps/client.h"
#include "tests/integration/local_shards.h"

namespace asyncps::testing {

inline constexpr float kInit = 1.0f;
inline constexpr float kLr = 0.5f;

// Worker `rank` of a job of 2 on `shards`, with slices of 1 KiB.
inline ClientOptions WorkerOptions(const LocalShards& shards, int rank) {
  ClientOptions options;
  for (const ServerAddress& a : shards.addresses) {
    options.servers.push_back(a.ToString());
  }
  options.rank = rank;
  options.num_workers = 2;
  options.slice_bytes = 1024;
  return options;
}

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_PS_EXCHANGE_JOB_H_
