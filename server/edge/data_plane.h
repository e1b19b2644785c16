// DataPlaneServer: a shard's Pull, Push and PushPull over TCP
// (transport/frame.h), plain or TLS, beside its gRPC service, for the tensors'
// bytes: no HTTP/2 framing, no protobuf copy of a payload, no hop between
// gRPC's threads. Each connection has a thread of its own that reads a frame,
// hands it to the same Consistency the gRPC service uses (so every rule
// about a request is the same on both transports) and writes the answer;
// a held pull (ssp, bsp) holds that connection's thread.
//
// With TLS (DataPlaneConfig::tls) a connection starts with a handshake that
// checks the client's certificate as the gRPC server does; then, either
// way, its first frame must be a DataHello carrying the shard's token
// (from the DataPlane RPC); a frame that breaks the framing is answered
// with an error naming what was wrong and the connection closed; a request
// the store refuses is answered with its error and the connection kept.
// Thread-safe.
#ifndef ASYNCPS_SERVER_EDGE_DATA_PLANE_H_
#define ASYNCPS_SERVER_EDGE_DATA_PLANE_H_

#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/consistency.h"
#include "server/edge/call_observer.h"
#include "server/held_calls.h"
#include "server/membership.h"
#include "server/replication.h"
#include "server/shard_store.h"
#include "transport/frame.h"
#include "transport/socket.h"
#include "transport/stream.h"
#include "transport/tls.h"

namespace asyncps {

struct DataPlaneConfig {
  std::string host = "0.0.0.0";
  int port = 0;  // 0: the kernel picks one.
  // The largest frame body accepted (--max_message_bytes).
  uint64_t max_frame_bytes = 64 << 20;
  // How long the rest of a frame may take once its header arrived, and
  // how long an answer may take to be written.
  absl::Duration frame_timeout = absl::Seconds(30);
  int max_connections = 1024;
  // Of those, how many one peer address may hold (so that one client
  // cannot take them all).
  int max_connections_per_peer = 256;
  // Told what each request cost (metrics); borrowed, may be null.
  CallObserver* observer = nullptr;
  // TLS (TlsContext::ForServer), or null for plain TCP.
  std::shared_ptr<const TlsContext> tls;
  // A replicated shard's member (borrowed; null: not replicated): a
  // backup's kJoin hands its connection to this for the replication stream.
  Replication* replication = nullptr;
};

class DataPlaneServer {
 public:
  // Listens and starts accepting. The pointers are borrowed and must
  // outlive the server; `token` is what each connection must present.
  static absl::StatusOr<std::unique_ptr<DataPlaneServer>> Start(
      const DataPlaneConfig& config, std::string token, ShardStore* store,
      Membership* membership, Consistency* consistency, Clock* clock);
  ~DataPlaneServer() { Shutdown(); }
  DataPlaneServer(const DataPlaneServer&) = delete;
  DataPlaneServer& operator=(const DataPlaneServer&) = delete;

  int port() const { return port_; }
  const std::string& token() const { return token_; }
  // Stops accepting, breaks every connection (a request being served
  // finishes; its answer may not reach the client) and joins their
  // threads. Call after Consistency::Shutdown, which answers held pulls.
  // Idempotent.
  void Shutdown();

 private:
  struct Connection {
    Socket socket;
    std::string peer;  // The client's address (PeerHost).
    std::thread thread;
    bool done = false;
  };

  DataPlaneServer(const DataPlaneConfig& config, std::string token,
                  ShardStore* store, Membership* membership,
                  Consistency* consistency, Clock* clock);
  void AcceptLoop();
  // Serves one connection until it closes, breaks, or the server stops.
  void Serve(Connection* c);
  // Its hello, then its requests, one after another.
  void Converse(Stream* stream);
  // The connection's stream over `fd`: plain, or TLS once the handshake
  // succeeded (it is bounded by frame_timeout).
  absl::StatusOr<std::unique_ptr<Stream>> Open(int fd);
  absl::Status Hello(Stream* stream);
  // Reads the body of a request whose header is `header`, serves it and
  // writes the answer. An error return means the connection is unusable.
  // `spare`: the connection's payload buffers, reused frame after frame.
  absl::Status Handle(Stream* stream, const FrameHeader& header,
                      std::vector<std::string>* spare);
  // A backup's join: the connection becomes its replication stream
  // (Replication::ServeBackup) until that ends, which the error return says.
  // A shard that is not replicated refuses it with FAILED_PRECONDITION.
  absl::Status ServeJoin(Stream* stream, const FrameHeader& header);
  // Membership::Authorize for a data-plane call; a refusal is counted.
  absl::Status Authorize(int rank, uint64_t secret, int64_t clock,
                         bool anyone = false);
  // Starts a call with `start` and waits for its answer, with the deadline
  // the frame carries; the call is cancelled if the client hangs up.
  absl::Status Await(Stream* stream, const FrameHeader& header,
                     const std::function<void(PendingCall)>& start);
  // Joins the threads of connections that ended.
  void Reap() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Why a new connection from `peer` is refused (RESOURCE_EXHAUSTED), or
  // OK if there is room for it.
  absl::Status Room(const std::string& peer) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const DataPlaneConfig config_;
  const std::string token_;
  ShardStore* const store_;
  Membership* const membership_;
  Consistency* const consistency_;
  Clock* const clock_;
  Socket listener_;
  int port_ = 0;
  std::thread acceptor_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::list<Connection> connections_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_EDGE_DATA_PLANE_H_
