// Collective: the all-reduce under AllreduceExchange. Gloo's ring over TCP
// on host memory (any backend), or NCCL between GPUs (CUDA builds). Both
// meet through the servers' rendezvous store. Used by one thread at a time.
#ifndef ASYNCPS_WORKER_COLLECTIVE_H_
#define ASYNCPS_WORKER_COLLECTIVE_H_

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "common/rendezvous_store.h"

namespace asyncps {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual std::string Name() const = 0;
  // Sums `data` across every worker, in place; every worker ends with the
  // same bits. `tag` tells concurrent operations apart.
  virtual absl::Status AllreduceSum(std::vector<float>* data, uint32_t tag) = 0;
  // The same over IEEE half values (`data` holds their bits), each
  // partial sum rounded to half (Horovod's fp16 compression: half the
  // bytes on the ring). UNIMPLEMENTED where the collective has none.
  virtual absl::Status AllreduceSumHalf(std::vector<uint16_t>* data,
                                        uint32_t tag) {
    (void)data;
    (void)tag;
    return absl::UnimplementedError(
        absl::StrCat(Name(), " has no f16 all-reduce"));
  }
};

struct CollectiveConfig {
  std::string kind = "gloo";  // gloo or nccl.
  int rank = 0;
  int num_workers = 1;
  std::string host = "127.0.0.1";  // gloo: the address peers reach us on.
  int cuda_device = -1;            // nccl: this worker's GPU.
  absl::Duration timeout = absl::Seconds(30);  // Of each operation.
  // Of joining: waiting for the others' addresses, and for each to connect
  // (0: `timeout`).
  absl::Duration join_timeout = absl::ZeroDuration();
  // Rendezvous keys go under this prefix in the servers' store.
  std::string prefix;
};

// How long one attempt at joining may wait, with `left` until the join's
// deadline: the config's join timeout (0: its timeout), at least 1 s.
inline absl::Duration JoinAttemptTimeout(const CollectiveConfig& config,
                                         absl::Duration left) {
  const absl::Duration join = config.join_timeout > absl::ZeroDuration()
                                  ? config.join_timeout
                                  : config.timeout;
  return std::max(absl::Seconds(1), std::min(join, left));
}

// Whether a failed join is worth an attempt at a newer ring (a peer died,
// came late or left an address behind), not a mistake that would fail
// again (nccl without CUDA, a bad address).
inline bool JoinMayBeRetried(const absl::Status& failed) {
  return failed.code() == absl::StatusCode::kUnavailable ||
         failed.code() == absl::StatusCode::kAborted ||
         failed.code() == absl::StatusCode::kDeadlineExceeded;
}

// Joins the collective of every worker. `store` is borrowed and must
// outlive the result. FAILED_PRECONDITION for nccl in a build without CUDA.
absl::StatusOr<std::unique_ptr<Collective>> JoinCollective(
    const CollectiveConfig& config, RendezvousStore* store);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_COLLECTIVE_H_
