// Status helpers shared by every asyncps process: the early-return macros
// (common/status_macros.h) and the mapping between absl::Status and
// grpc::Status, whose codes are the same numbers.
#ifndef ASYNCPS_COMMON_STATUS_H_
#define ASYNCPS_COMMON_STATUS_H_

#include <grpcpp/support/status.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/status_macros.h"

namespace asyncps {

// Converts between Abseil's and gRPC's status types. Code and message are
// kept; OK maps to OK.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes `status`'s message with `context` ("context: message"); OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STATUS_H_
