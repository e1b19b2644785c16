#include "common/transport_kind.h"

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::StatusOr<Transport> ParseTransport(absl::string_view text) {
  if (text == "tcp") return Transport::kTcp;
  if (text == "grpc") return Transport::kGrpc;
  return absl::InvalidArgumentError(
      absl::StrCat("--transport=", text, " is not one of tcp, grpc"));
}

const char* TransportName(Transport transport) {
  return transport == Transport::kGrpc ? "grpc" : "tcp";
}

}  // namespace asyncps
