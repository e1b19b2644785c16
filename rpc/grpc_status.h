// The mapping between absl::Status and grpc::Status (their codes are the
// same numbers), for the two places a status crosses gRPC: the server's
// service methods and the client's calls. Core code speaks absl::Status
// only (common/status.h).
#ifndef ASYNCPS_RPC_GRPC_STATUS_H_
#define ASYNCPS_RPC_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace asyncps {

// Code and message are kept; OK maps to OK.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace asyncps

#endif  // ASYNCPS_RPC_GRPC_STATUS_H_
