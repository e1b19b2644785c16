#include "server/edge/data_plane.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/security.h"
#include "common/status.h"
#include "glog/logging.h"

namespace asyncps {
namespace {

// Errors that say the client broke the framing or its welcome: answered,
// counted as rejected, and the connection closed. Others (UNAVAILABLE,
// DEADLINE_EXCEEDED) are the connection itself failing.
bool IsProtocolError(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kResourceExhausted ||
         s.code() == absl::StatusCode::kPermissionDenied;
}

// Writes the answer to a request: the response, or the error.
template <typename Response>
absl::Status Answer(Stream* stream, const absl::Status& status,
                    Response* response, absl::Time deadline) {
  if (!status.ok()) return WriteError(stream, status, deadline);
  FrameHeader header;
  header.op = FrameOp::kAnswer;
  return WriteFrame(stream, header, response, PayloadFields(response),
                    deadline);
}

// A hello is a token and little else.
constexpr uint64_t kMaxHelloBytes = 4096;

}  // namespace

DataPlaneServer::DataPlaneServer(const DataPlaneConfig& config,
                                 std::string token, ShardStore* store,
                                 Membership* membership,
                                 Consistency* consistency, Clock* clock)
    : config_(config),
      token_(std::move(token)),
      store_(store),
      membership_(membership),
      consistency_(consistency),
      clock_(clock) {}

absl::StatusOr<std::unique_ptr<DataPlaneServer>> DataPlaneServer::Start(
    const DataPlaneConfig& config, std::string token, ShardStore* store,
    Membership* membership, Consistency* consistency, Clock* clock) {
  std::unique_ptr<DataPlaneServer> server(new DataPlaneServer(
      config, std::move(token), store, membership, consistency, clock));
  ASSIGN_OR_RETURN(server->listener_,
                   ListenTcp(config.host, config.port, &server->port_));
  server->acceptor_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

void DataPlaneServer::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    stopping_ = true;
    ShutdownSocket(listener_.fd());
    for (Connection& c : connections_) {
      if (!c.done) ShutdownSocket(c.socket.fd());
    }
  }
  if (acceptor_.joinable()) acceptor_.join();
  std::list<Connection> all;
  {
    absl::MutexLock lock(&mu_);
    all.swap(connections_);
  }
  for (Connection& c : all) c.thread.join();
}

void DataPlaneServer::Reap() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if (it->done) {
      it->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

absl::Status DataPlaneServer::Room(const std::string& peer) const {
  if (static_cast<int>(connections_.size()) >= config_.max_connections) {
    return absl::ResourceExhaustedError(
        absl::StrCat("this shard serves at most ", config_.max_connections,
                     " data-plane connections"));
  }
  int from_peer = 0;
  for (const Connection& c : connections_) from_peer += c.peer == peer;
  if (from_peer >= config_.max_connections_per_peer) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this shard serves at most ", config_.max_connections_per_peer,
        " data-plane connections from one address (", peer, ")"));
  }
  return absl::OkStatus();
}

void DataPlaneServer::AcceptLoop() {
  while (true) {
    absl::StatusOr<Socket> accepted = AcceptTcp(listener_.fd());
    absl::MutexLock lock(&mu_);
    if (stopping_) return;
    if (!accepted.ok()) {
      LOG(WARNING) << "data plane: " << accepted.status();
      if (accepted.status().code() == absl::StatusCode::kResourceExhausted) {
        // Out of descriptors: give connections time to end, then go on.
        mu_.AwaitWithTimeout(absl::Condition(&stopping_),
                             absl::Milliseconds(100));
      }
      continue;
    }
    Reap();
    std::string peer = PeerHost(accepted->fd());
    if (absl::Status room = Room(peer); !room.ok()) {
      store_->CountRejected();
      if (config_.tls == nullptr) {
        // A fresh socket's buffer takes this short answer at once.
        TcpStream stream(accepted->fd());
        WriteError(&stream, room, absl::Now()).IgnoreError();
      } else {
        // No handshake for a connection that cannot stay: it is closed.
        LOG(WARNING) << "data plane: " << room;
      }
      continue;
    }
    connections_.emplace_back();
    Connection* c = &connections_.back();
    c->socket = *std::move(accepted);
    c->peer = std::move(peer);
    c->thread = std::thread([this, c] { Serve(c); });
  }
}

absl::StatusOr<std::unique_ptr<Stream>> DataPlaneServer::Open(int fd) {
  if (config_.tls == nullptr) return std::make_unique<TcpStream>(fd);
  absl::StatusOr<std::unique_ptr<Stream>> stream =
      config_.tls->Accept(fd, absl::Now() + config_.frame_timeout);
  if (!stream.ok()) {
    // Not our client (no certificate, another CA's, not TLS at all), or
    // one that left: either way the connection ends here.
    store_->CountRejected();
    VLOG(1) << "data plane: " << stream.status();
  }
  return stream;
}

void DataPlaneServer::Serve(Connection* c) {
  if (absl::StatusOr<std::unique_ptr<Stream>> stream = Open(c->socket.fd());
      stream.ok()) {
    Converse(stream->get());
  }
  // The stream is gone before its socket closes.
  absl::MutexLock lock(&mu_);
  c->done = true;
  c->socket.Close();
}

void DataPlaneServer::Converse(Stream* stream) {
  absl::Status s = Hello(stream);
  std::vector<std::string> spare;
  while (s.ok()) {
    // Idle between requests for as long as the client likes; once a frame
    // starts, the rest of it must come within frame_timeout.
    s = stream->WaitReadable(absl::InfiniteFuture());
    if (!s.ok()) break;
    absl::StatusOr<FrameHeader> header = ReadHeader(
        stream, config_.max_frame_bytes, absl::Now() + config_.frame_timeout);
    s = header.ok() ? Handle(stream, *header, &spare) : header.status();
  }
  if (IsProtocolError(s)) {
    store_->CountRejected();
    VLOG(1) << "data plane: closing a connection: " << s;
    const absl::Time deadline = absl::Now() + absl::Seconds(1);
    if (WriteError(stream, s, deadline).ok()) {
      LingerClose(stream->fd(), deadline);
    }
  }
}

absl::Status DataPlaneServer::Hello(Stream* stream) {
  const absl::Time deadline = absl::Now() + config_.frame_timeout;
  ASSIGN_OR_RETURN(FrameHeader header,
                   ReadHeader(stream, kMaxHelloBytes, deadline));
  if (header.op != FrameOp::kHello) {
    return absl::PermissionDeniedError(
        "a data-plane connection must open with a hello carrying the "
        "shard's token (from the DataPlane RPC)");
  }
  v1::DataHello hello;
  RETURN_IF_ERROR(ReadBody(
      stream, header, &hello, [&] { return PayloadFields(&hello); }, deadline));
  if (!ConstantTimeEquals(hello.token(), token_)) {
    return absl::PermissionDeniedError(
        "wrong data-plane token (the shard may have restarted: ask the "
        "DataPlane RPC again)");
  }
  v1::DataHello welcome;
  return Answer(stream, absl::OkStatus(), &welcome, deadline);
}

absl::Status DataPlaneServer::Await(
    Stream* stream, const FrameHeader& header,
    const std::function<void(PendingCall)>& start) {
  // Shared with the callback, which may run on another thread and outlive
  // this frame by the time it returns from Notify.
  struct State {
    absl::Notification answered;
    absl::Status status;
  };
  auto state = std::make_shared<State>();
  PendingCall call;
  if (header.timeout_ms > 0) {
    call.deadline = clock_->Now() + absl::Milliseconds(header.timeout_ms);
  }
  // On the socket itself, not the stream: another thread may ask.
  call.cancelled = [fd = stream->fd()] { return PeerClosed(fd); };
  call.done = [state](absl::Status s) {
    state->status = std::move(s);
    state->answered.Notify();
  };
  start(std::move(call));
  state->answered.WaitForNotification();
  return state->status;
}

// One request of type Request: its body read (into the connection's spare
// buffers), `run` to answer it, the buffers kept, the answer written.
// `observer` (may be null) is told what it cost, as `method`.
template <typename Request, typename Response, typename Run>
absl::Status Respond(Stream* stream, const FrameHeader& header,
                     absl::Duration frame_timeout,
                     std::vector<std::string>* spare, CallObserver* observer,
                     absl::string_view method, Run run) {
  const absl::Time start = absl::Now();
  Request request;
  Response response;
  RETURN_IF_ERROR(ReadBody(
      stream, header, &request, [&] { return PayloadFields(&request); },
      absl::Now() + frame_timeout, spare));
  const absl::Status s = run(request, &response);
  KeepSpares(PayloadFields(&request), spare);
  const int64_t sent = observer != nullptr && s.ok()
                           ? static_cast<int64_t>(response.ByteSizeLong())
                           : 0;
  absl::Status written =
      Answer(stream, s, &response, absl::Now() + frame_timeout);
  if (observer != nullptr) {
    observer->CallEnded("tcp", method, s.code(), absl::Now() - start,
                        static_cast<int64_t>(header.BodyBytes()), sent);
  }
  return written;
}

absl::Status DataPlaneServer::Authorize(int rank, uint64_t secret,
                                        int64_t clock, bool anyone) {
  absl::Status s = membership_->Authorize(rank, secret, clock, anyone);
  if (!s.ok()) store_->CountRejected();
  return s;
}

absl::Status DataPlaneServer::ServeJoin(Stream* stream,
                                        const FrameHeader& header) {
  const absl::Duration t = config_.frame_timeout;
  v1::ReplicaJoin join;
  RETURN_IF_ERROR(ReadBody(
      stream, header, &join, [&] { return PayloadFields(&join); },
      absl::Now() + t));
  if (config_.replication == nullptr) {
    store_->CountRejected();
    WriteError(stream,
               absl::FailedPreconditionError(
                   "this shard is not replicated (no --replicas)"),
               absl::Now() + t)
        .IgnoreError();
    return absl::UnavailableError("a join on an unreplicated shard");
  }
  // The connection is the backup's stream until it ends.
  absl::Status s = config_.replication->ServeBackup(stream, join);
  if (absl::IsPermissionDenied(s)) {
    store_->CountRejected();
    LOG(WARNING) << s;
  }
  if (absl::IsFailedPrecondition(s) || absl::IsPermissionDenied(s)) {
    WriteError(stream, s, absl::Now() + t).IgnoreError();
  }
  return absl::UnavailableError(
      absl::StrCat("replication stream ended: ", s.message()));
}

absl::Status DataPlaneServer::Handle(Stream* stream, const FrameHeader& header,
                                     std::vector<std::string>* spare) {
  const absl::Duration t = config_.frame_timeout;
  CallObserver* const o = config_.observer;
  switch (header.op) {
    case FrameOp::kPull:
      return Respond<v1::PullRequest, v1::PullResponse>(
          stream, header, t, spare, o, "Pull",
          [&](const auto& request, auto* response) {
            RETURN_IF_ERROR(Authorize(request.rank(), request.secret(),
                                      request.clock(), /*anyone=*/true));
            return Await(stream, header, [&](PendingCall call) {
              consistency_->Pull(request, response, std::move(call));
            });
          });
    case FrameOp::kPush:
      return Respond<v1::PushRequest, v1::PushResponse>(
          stream, header, t, spare, o, "Push",
          [&](const auto& request, auto* response) {
            RETURN_IF_ERROR(
                Authorize(request.rank(), request.secret(), request.clock()));
            return consistency_->Push(request, response);
          });
    case FrameOp::kPushPull:
      return Respond<v1::PushPullRequest, v1::PushPullResponse>(
          stream, header, t, spare, o, "PushPull",
          [&](const auto& request, auto* response) {
            const v1::PushRequest& push = request.push();
            RETURN_IF_ERROR(
                Authorize(push.rank(), push.secret(), push.clock()));
            return Await(stream, header, [&](PendingCall call) {
              consistency_->PushPull(request, response, std::move(call));
            });
          });
    case FrameOp::kPullRows:
      return Respond<v1::PullRowsRequest, v1::PullRowsResponse>(
          stream, header, t, spare, o, "PullRows",
          [&](const auto& request, auto* response) {
            RETURN_IF_ERROR(Authorize(request.rank(), request.secret(),
                                      request.clock(), /*anyone=*/true));
            return Await(stream, header, [&](PendingCall call) {
              consistency_->PullRows(request, response, std::move(call));
            });
          });
    case FrameOp::kPushRows:
      return Respond<v1::PushRowsRequest, v1::PushRowsResponse>(
          stream, header, t, spare, o, "PushRows",
          [&](const auto& request, auto* response) {
            RETURN_IF_ERROR(
                Authorize(request.rank(), request.secret(), request.clock()));
            return Await(stream, header, [&](PendingCall call) {
              consistency_->PushRows(request, response, std::move(call));
            });
          });
    case FrameOp::kJoin:
      return ServeJoin(stream, header);
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "data-plane op ", static_cast<int>(header.op),
          " is not a request (hello comes once, answers come from the "
          "server)"));
  }
}

}  // namespace asyncps
