// Early-return macros for absl::Status and absl::StatusOr (this Abseil has no
// ABSL_RETURN_IF_ERROR). No dependency beyond Abseil, so any library may use
// them.
#ifndef ASYNCPS_COMMON_STATUS_MACROS_H_
#define ASYNCPS_COMMON_STATUS_MACROS_H_

#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

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

#endif  // ASYNCPS_COMMON_STATUS_MACROS_H_
