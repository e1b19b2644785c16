// Dialing a shard's data plane (server/edge/data_plane.h): the TCP
// connection, TLS over it when asked, and the hello frame that presents the
// shard's token and waits for its welcome. Every connection to a data plane
// opens this way: a client's (client/data_channel.h) and a backup's to its
// primary (server/replica/replica_member.h), which then sends its kJoin on
// the same stream. Where the address and token come from (the shard's
// DataPlane RPC) is the caller's business: this layer knows no gRPC.
// Thread-safe (it keeps no state).
#ifndef ASYNCPS_TRANSPORT_DIAL_H_
#define ASYNCPS_TRANSPORT_DIAL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/socket.h"
#include "transport/stream.h"
#include "transport/tls.h"

namespace asyncps {

// Where a shard's data plane listens and the token it wants.
struct DataPlaneAddress {
  std::string host;
  int port = 0;  // 0: the shard has no data plane.
  std::string token;
};

// A connection past its hello, ready for requests (or a kJoin).
struct DataPlaneConnection {
  Socket socket;
  std::unique_ptr<Stream> stream;  // Over socket; declared after it, so
                                   // destroyed before it closes.
};

// Connects to `address` (with TLS if `tls` is not null: the shard's
// certificate must name address.host), sends the hello with its token and
// reads the welcome, all by `deadline`. Errors name the address and what
// failed. UNAVAILABLE: the connection was refused or broke, TLS failed, the
// welcome broke or did not come in time, or the shard refused the hello
// (its reason in the message, e.g. a wrong token: the shard restarted since
// it was asked, so asking again and redialing will do). DEADLINE_EXCEEDED:
// `deadline` passed before the connection opened or the hello was sent.
// FAILED_PRECONDITION: the address has no port (the shard serves no data
// plane).
absl::StatusOr<DataPlaneConnection> DialDataPlane(
    const DataPlaneAddress& address, const TlsContext* tls,
    absl::Time deadline);

}  // namespace asyncps

#endif  // ASYNCPS_TRANSPORT_DIAL_H_
