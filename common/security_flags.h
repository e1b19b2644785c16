// The security flags every binary takes (--tls_cert, --tls_key, --tls_ca,
// --auth_token_file), defined once for ps_server, ps_worker and psctl.
#ifndef ASYNCPS_COMMON_SECURITY_FLAGS_H_
#define ASYNCPS_COMMON_SECURITY_FLAGS_H_

#include "common/security.h"

namespace asyncps {

// The flags as parsed. REQUIRES: absl::ParseCommandLine ran.
SecurityFlags SecurityFlagsFromCommandLine();

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_SECURITY_FLAGS_H_
