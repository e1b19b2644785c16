// DataChannel: a client's connections to one shard's data plane
// (server/edge/data_plane.h), plain TCP or TLS, pooled so that several threads
// may each have a request in flight. The shard's port and token come from its
// DataPlane RPC when the first connection opens, and again after a connection
// fails (a restarted shard has a new port and token). Thread-safe.
#ifndef ASYNCPS_CLIENT_DATA_CHANNEL_H_
#define ASYNCPS_CLIENT_DATA_CHANNEL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "transport/dial.h"
#include "transport/frame.h"
#include "transport/socket.h"
#include "transport/stream.h"
#include "transport/tls.h"

namespace asyncps {

// One connection: one request at a time, its answer read before the next.
// Not thread-safe.
class DataConnection {
 public:
  // Dials the shard (transport/dial.h: TLS if `tls` is not null, the
  // hello with the token); its errors.
  static absl::StatusOr<std::unique_ptr<DataConnection>> Open(
      const DataPlaneAddress& address, const TlsContext* tls,
      uint64_t max_frame_bytes, absl::Time deadline);

  // Sends `request` as an `op` frame that tells the server to give up on it
  // after `timeout`.
  template <typename Request>
  absl::Status Send(FrameOp op, Request* request, absl::Duration timeout,
                    absl::Time deadline) {
    return SendFrame(op, request, PayloadFields(request), timeout, deadline);
  }
  // Reads the answer: OK with `response` filled, or the server's error, or
  // the transport's (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL for a
  // malformed answer).
  template <typename Response>
  absl::Status Receive(Response* response, absl::Time deadline) {
    return ReceiveFrame(
        response, [response] { return PayloadFields(response); }, deadline);
  }
  // True once anything went wrong: the connection must not be reused.
  bool broken() const { return broken_; }
  // The index of one of `connections` whose answer has begun to arrive (or
  // that closed), once one has; DEADLINE_EXCEEDED past `deadline`.
  static absl::StatusOr<size_t> WaitAny(
      absl::Span<DataConnection* const> connections, absl::Time deadline);

 private:
  DataConnection(DataPlaneConnection dialed, uint64_t max_frame_bytes)
      : socket_(std::move(dialed.socket)),
        stream_(std::move(dialed.stream)),
        max_frame_bytes_(max_frame_bytes) {}
  absl::Status SendFrame(FrameOp op, google::protobuf::MessageLite* request,
                         const std::vector<std::string*>& payloads,
                         absl::Duration timeout, absl::Time deadline);
  absl::Status ReceiveFrame(
      google::protobuf::MessageLite* response,
      const std::function<std::vector<std::string*>()>& fields,
      absl::Time deadline);

  Socket socket_;
  std::unique_ptr<Stream> stream_;  // Over socket_; destroyed before it.
  const uint64_t max_frame_bytes_;
  bool broken_ = false;
};

class DataChannel {
 public:
  // Asks the shard where its data plane is (one attempt, by `deadline`).
  using Discover =
      std::function<absl::StatusOr<DataPlaneAddress>(absl::Time deadline)>;

  // `tls`: the client's TLS (TlsContext::ForClient), or null for plain TCP.
  DataChannel(Discover discover, std::shared_ptr<const TlsContext> tls,
              uint64_t max_frame_bytes)
      : discover_(std::move(discover)),
        tls_(std::move(tls)),
        max_frame_bytes_(max_frame_bytes) {}

  // An idle connection, or a new one. UNAVAILABLE if the shard cannot be
  // reached (callers retry); FAILED_PRECONDITION if it has no data plane.
  absl::StatusOr<std::unique_ptr<DataConnection>> Take(absl::Time deadline);
  // Returns a connection after a request; kept for the next one unless
  // broken.
  void Give(std::unique_ptr<DataConnection> connection);
  // Forgets the address and every idle connection, after a failure that
  // may mean the shard restarted.
  void Reset();

 private:
  const Discover discover_;
  const std::shared_ptr<const TlsContext> tls_;
  const uint64_t max_frame_bytes_;

  absl::Mutex mu_;
  std::optional<DataPlaneAddress> address_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<DataConnection>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_DATA_CHANNEL_H_
