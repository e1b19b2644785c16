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

// Prefixes `status`'s message with `context` ("context: message"); OK stays OK.
absl::Status Annotate(const absl::Status& status, absl::string_view context);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_STATUS_H_
