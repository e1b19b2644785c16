#include "worker/cuda/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "worker/poll_until.h"

namespace asyncps {
namespace {

absl::Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

absl::Status NcclError(ncclResult_t r, const char* what) {
  if (r == ncclSuccess || r == ncclInProgress) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

// Whether `comm` has no non-blocking call in flight (init, or an enqueue
// that answered ncclInProgress); its error if one failed. `what` names the
// call in that error.
absl::StatusOr<bool> CommIdle(ncclComm_t comm, const char* what) {
  ncclResult_t state = ncclSuccess;
  RETURN_IF_ERROR(
      NcclError(ncclCommGetAsyncError(comm, &state), "ncclCommGetAsyncError"));
  if (state == ncclInProgress) return false;
  RETURN_IF_ERROR(NcclError(state, what));
  return true;
}

// Waits until `comm` is idle (CommIdle), or fails at `deadline`.
absl::Status WaitForComm(ncclComm_t comm, absl::Time deadline,
                         const char* what) {
  return PollUntil([comm, what] { return CommIdle(comm, what); }, deadline,
                   what);
}

// Every communicator is non-blocking: NCCL's blocking calls never give up,
// so a peer that died would hang this worker for good. Each wait is
// bounded by --collective_timeout; past it (or on NCCL's own error) the
// communicator is aborted and the call fails, as the Gloo path does, and
// AllreduceExchange names the rank that stopped answering.
class NcclCollective final : public Collective {
 public:
  NcclCollective(int device, ncclComm_t comm, cudaStream_t stream,
                 absl::Duration timeout)
      : device_(device), comm_(comm), stream_(stream), timeout_(timeout) {}
  ~NcclCollective() override {
    cudaSetDevice(device_);
    if (!aborted_) ncclCommDestroy(comm_);
    cudaFree(buffer_);
    cudaStreamDestroy(stream_);
  }

  std::string Name() const override {
    return absl::StrCat("nccl on cuda:", device_);
  }

  absl::Status AllreduceSum(std::vector<float>* data, uint32_t tag) override {
    if (data->empty()) return absl::OkStatus();
    if (aborted_) {
      return absl::UnavailableError(
          "the NCCL communicator was aborted after an earlier failure");
    }
    const absl::Time deadline = absl::Now() + timeout_;
    absl::Status s = Run(data, deadline);
    if (!s.ok() && !aborted_) {
      // Ends the kernels waiting for a peer that will not come.
      ncclCommAbort(comm_);
      aborted_ = true;
      return absl::UnavailableError(
          absl::StrCat(s.message(), " (NCCL communicator aborted)"));
    }
    return s;
  }

 private:
  absl::Status Run(std::vector<float>* data, absl::Time deadline) {
    // The exchange's thread, not the one that created the communicator.
    absl::Status s = CudaError(cudaSetDevice(device_), "cudaSetDevice");
    if (!s.ok()) return s;
    const size_t bytes = data->size() * sizeof(float);
    if (bytes > capacity_) {
      cudaFree(buffer_);
      buffer_ = nullptr;
      capacity_ = 0;
      s = CudaError(cudaMalloc(&buffer_, bytes), "cudaMalloc");
      if (!s.ok()) return s;
      capacity_ = bytes;
    }
    s = CudaError(cudaMemcpyAsync(buffer_, data->data(), bytes,
                                  cudaMemcpyHostToDevice, stream_),
                  "copy to GPU");
    if (!s.ok()) return s;
    const ncclResult_t queued = ncclAllReduce(
        buffer_, buffer_, data->size(), ncclFloat, ncclSum, comm_, stream_);
    s = NcclError(queued, "ncclAllReduce");
    if (!s.ok()) return s;
    if (queued == ncclInProgress) {
      s = WaitForComm(comm_, deadline, "ncclAllReduce (enqueue)");
      if (!s.ok()) return s;
    }
    s = CudaError(cudaMemcpyAsync(data->data(), buffer_, bytes,
                                  cudaMemcpyDeviceToHost, stream_),
                  "copy from GPU");
    if (!s.ok()) return s;
    // The stream finishes once every peer has taken part; a dead one shows
    // as the deadline passing (or as NCCL's asynchronous error).
    return PollUntil(
        [this]() -> absl::StatusOr<bool> {
          const cudaError_t q = cudaStreamQuery(stream_);
          if (q == cudaSuccess) return true;
          if (q != cudaErrorNotReady) return CudaError(q, "all-reduce");
          // Not done yet: failed, if NCCL says so asynchronously.
          absl::StatusOr<bool> idle = CommIdle(comm_, "all-reduce");
          if (!idle.ok()) return idle.status();
          return false;
        },
        deadline, "the all-reduce");
  }

  const int device_;
  const ncclComm_t comm_;
  const cudaStream_t stream_;
  const absl::Duration timeout_;
  bool aborted_ = false;
  void* buffer_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Collective>> JoinNccl(
    const CollectiveConfig& config, RendezvousStore* store) {
  if (config.cuda_device < 0) {
    return absl::FailedPreconditionError(
        "--collective=nccl needs the worker on a GPU (--device=cuda:N)");
  }
  absl::Status s =
      CudaError(cudaSetDevice(config.cuda_device), "cudaSetDevice");
  if (!s.ok()) return s;
  ncclUniqueId id;
  const std::string key = absl::StrCat(config.prefix, "nccl_id");
  if (config.rank == 0) {
    s = NcclError(ncclGetUniqueId(&id), "ncclGetUniqueId");
    if (!s.ok()) return s;
    s = store->StoreSet(key, std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    auto v = store->StoreGet(key, config.timeout);
    if (!v.ok()) return v.status();
    if (v->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat("NCCL id in the store has ",
                                              v->size(), " bytes, want ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, v->data(), sizeof(id.internal));
  }
  cudaStream_t stream;
  s = CudaError(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                "cudaStreamCreate");
  if (!s.ok()) return s;
  ncclConfig_t nccl_config = NCCL_CONFIG_INITIALIZER;
  nccl_config.blocking = 0;
  ncclComm_t comm = nullptr;
  s = NcclError(ncclCommInitRankConfig(&comm, config.num_workers, id,
                                       config.rank, &nccl_config),
                "ncclCommInitRankConfig");
  if (s.ok()) {
    // Every rank must join within the timeout; one that never comes would
    // otherwise hold the others here for good.
    s = WaitForComm(comm, absl::Now() + config.timeout,
                    "joining the NCCL communicator");
  }
  if (!s.ok()) {
    if (comm != nullptr) ncclCommAbort(comm);
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Collective>(
      new NcclCollective(config.cuda_device, comm, stream, config.timeout));
}

}  // namespace asyncps
