// Transport: which way a client's Pull, Push and PushPull travel
// (--transport). Below client/ so that a program's flags can name it
// without compiling against gRPC.
#ifndef ASYNCPS_COMMON_TRANSPORT_KIND_H_
#define ASYNCPS_COMMON_TRANSPORT_KIND_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

// How Pull, Push and PushPull travel (the other calls always use gRPC).
enum class Transport {
  kTcp,   // The shards' data planes: framed TCP, no protobuf copies.
  kGrpc,  // The gRPC service.
};

// "tcp" or "grpc" (--transport); INVALID_ARGUMENT naming the flag otherwise.
absl::StatusOr<Transport> ParseTransport(absl::string_view text);

// "tcp" or "grpc": what ParseTransport reads back.
const char* TransportName(Transport transport);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_TRANSPORT_KIND_H_
