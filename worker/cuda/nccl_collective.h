// NCCL all-reduce between the workers' GPUs (one GPU per worker process).
// The unique id goes from rank 0 to the others through the servers'
// rendezvous store. Gradients arrive on the host (the exchange's contract),
// so each call copies them to the GPU, all-reduces there and copies back.
#ifndef ASYNCPS_WORKER_CUDA_NCCL_COLLECTIVE_H_
#define ASYNCPS_WORKER_CUDA_NCCL_COLLECTIVE_H_

#include <memory>

#include "absl/status/statusor.h"
#include "worker/collective.h"

namespace asyncps {

// REQUIRES: config.cuda_device >= 0.
absl::StatusOr<std::unique_ptr<Collective>> JoinNccl(
    const CollectiveConfig& config, RendezvousStore* store);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_CUDA_NCCL_COLLECTIVE_H_
