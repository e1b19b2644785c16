#include "worker/cuda/nccl_collective.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

absl::Status CudaError(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(err)));
}

absl::Status NcclError(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat(what, ": ", ncclGetErrorString(r)));
}

class NcclCollective final : public Collective {
 public:
  NcclCollective(int device, ncclComm_t comm, cudaStream_t stream)
      : device_(device), comm_(comm), stream_(stream) {}
  ~NcclCollective() override {
    cudaSetDevice(device_);
    ncclCommDestroy(comm_);
    cudaFree(buffer_);
    cudaStreamDestroy(stream_);
  }

  std::string Name() const override {
    return absl::StrCat("nccl on cuda:", device_);
  }

  absl::Status AllreduceSum(std::vector<float>* data, uint32_t tag) override {
    if (data->empty()) return absl::OkStatus();
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
    s = NcclError(ncclAllReduce(buffer_, buffer_, data->size(), ncclFloat,
                                ncclSum, comm_, stream_),
                  "ncclAllReduce");
    if (!s.ok()) return s;
    s = CudaError(cudaMemcpyAsync(data->data(), buffer_, bytes,
                                  cudaMemcpyDeviceToHost, stream_),
                  "copy from GPU");
    if (!s.ok()) return s;
    return CudaError(cudaStreamSynchronize(stream_), "all-reduce");
  }

 private:
  const int device_;
  const ncclComm_t comm_;
  const cudaStream_t stream_;
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
  ncclComm_t comm;
  s = NcclError(ncclCommInitRank(&comm, config.num_workers, id, config.rank),
                "ncclCommInitRank");
  if (!s.ok()) {
    cudaStreamDestroy(stream);
    return s;
  }
  return std::unique_ptr<Collective>(
      new NcclCollective(config.cuda_device, comm, stream));
}

}  // namespace asyncps
