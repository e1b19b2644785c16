// Status helpers shared by every asyncps process: the early-return macros
// (common/status_macros.h) and Annotate. The gRPC mapping is apart
// (rpc/grpc_status.h), so core code does not include gRPC.
#ifndef ASYNCPS_COMMON_STATUS_H_
#define ASYNCPS_COMMON_STATUS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace asyncps {

// Prefixes `status`'s message with `context` ("context: message"); OK stays
// OK; the payloads stay.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

// INVALID_ARGUMENT for a request with a NaN or Inf value in it, marked so
// (IsNonFinite) that a shard counts it against the rank that sent it
// (psctl doctor names a worker pushing NaN).
absl::Status NonFiniteError(absl::string_view message);
bool IsNonFinite(const absl::Status& status);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STATUS_H_
