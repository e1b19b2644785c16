// Status helpers shared by every asyncps process: early-return macros (this
// Abseil has no ABSL_RETURN_IF_ERROR) and the mapping between absl::Status and
// grpc::Status, whose codes are the same numbers.
#ifndef ASYNCPS_COMMON_STATUS_H_
#define ASYNCPS_COMMON_STATUS_H_

#include <grpcpp/support/status.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace asyncps {

// Converts between Abseil's and gRPC's status types. Code and message are
// kept; OK maps to OK.
grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

// Prefixes `status`'s message with `context` ("context: message"); OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace asyncps

#define ASYNCPS_STATUS_CONCAT_INNER_(a, b) a##b
#define ASYNCPS_STATUS_CONCAT_(a, b) ASYNCPS_STATUS_CONCAT_INNER_(a, b)

// Returns from the enclosing function if `expr` (an absl::Status) is not OK.
#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    ::absl::Status asyncps_status_ = (expr);           \
    if (!asyncps_status_.ok()) return asyncps_status_; \
  } while (false)

// `lhs` = the value of `rexpr` (an absl::StatusOr<T>), or returns its status.
#define ASSIGN_OR_RETURN(lhs, rexpr)                                          \
  ASSIGN_OR_RETURN_IMPL_(ASYNCPS_STATUS_CONCAT_(asyncps_statusor_, __LINE__), \
                         lhs, rexpr)
#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                           \
  if (!statusor.ok()) return statusor.status();      \
  lhs = std::move(statusor).value()

#endif  // ASYNCPS_COMMON_STATUS_H_
