// A backup's side of its group's stream (server/replica/replica_member.h):
// Follow joins the primary (the DataPlane RPC, the shard dial, kJoin with
// the epoch and the members' token) and applies its ops in order until the
// stream ends.
#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/cluster_spec.h"
#include "common/security.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "proto/asyncps.grpc.pb.h"
#include "rpc/grpc_credentials.h"
#include "rpc/grpc_status.h"
#include "server/replica/replica_member.h"
#include "transport/dial.h"
#include "transport/frame.h"
#include "transport/socket.h"
#include "transport/tls.h"

namespace asyncps {
namespace {

// How long a step of joining (the DataPlane RPC, the connection, the hello)
// may take. These and kFrameTimeout are real time (absl::Now()), not the
// Env's clock: gRPC and the sockets' poll enforce them.
constexpr absl::Duration kJoinStepTimeout = absl::Seconds(5);
// How long a frame of the stream may take once it began.
constexpr absl::Duration kFrameTimeout = absl::Seconds(60);
// How long a look at a primary whose stream broke may take (a connection,
// then its Stats): longer is taken for a partition.
constexpr absl::Duration kProbeTimeout = absl::Milliseconds(300);

// One call to another member's gRPC service, as this member's server is
// configured (TLS, the workers' token), within `timeout`.
struct MemberCall {
  MemberCall(const std::string& address, const Security& security,
             absl::Duration timeout)
      : stub(v1::ParameterServer::NewStub(
            grpc::CreateChannel(address, MakeChannelCredentials(security)))) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    if (!security.token.empty()) {
      context.AddMetadata(kAuthorizationKey, BearerValue(security.token));
    }
  }
  std::unique_ptr<v1::ParameterServer::Stub> stub;
  grpc::ClientContext context;
};

}  // namespace

void ReplicaMember::Follow(std::string address, int64_t epoch) {
  absl::Status s = FollowOnce(address, epoch);
  LOG(WARNING) << "shard " << shard_ << ": member " << member_
               << " left the stream of " << address << " (epoch " << epoch
               << "): " << s;
  absl::MutexLock lock(&mu_);
  stream_ended_ = true;
  stream_broke_ = absl::IsUnavailable(s);
  wake_ = true;  // The loop looks at once.
  follower_fd_ = -1;
}

bool ReplicaMember::PrimaryMayLive(const std::string& address, int64_t epoch) {
  absl::StatusOr<std::vector<ServerAddress>> parsed = ParseServerList(address);
  if (!parsed.ok()) return true;
  const ServerAddress& primary = (*parsed)[0];
  absl::StatusOr<bool> refused = RefusesConnections(
      primary.host, primary.port, absl::Now() + kProbeTimeout);
  if (!refused.ok()) return true;  // No answer: the lease decides.
  if (*refused) return false;      // No process holds its port.
  // Something listens there: the primary, or a process started in its
  // place (a supervisor restarting the member at once), which says so.
  MemberCall call(address, server_->config().security, kProbeTimeout);
  v1::StatsRequest request;
  v1::StatsResponse stats;
  if (!call.stub->Stats(&call.context, request, &stats).ok()) return true;
  return stats.replica().role() == "primary" &&
         stats.replica().epoch() == epoch;
}

absl::Status ReplicaMember::FollowOnce(const std::string& address,
                                       int64_t epoch) {
  const ShardServerConfig& sc = server_->config();
  ASSIGN_OR_RETURN(std::vector<ServerAddress> parsed, ParseServerList(address));
  const ServerAddress& primary = parsed[0];
  // Where the primary's data plane is, and its token.
  MemberCall call(address, sc.security, kJoinStepTimeout);
  v1::DataPlaneRequest request;
  v1::DataPlaneResponse dp;
  RETURN_IF_ERROR(
      FromGrpcStatus(call.stub->DataPlane(&call.context, request, &dp)));
  absl::Time deadline = absl::Now() + kJoinStepTimeout;
  std::shared_ptr<const TlsContext> tls;
  if (sc.security.tls()) {
    ASSIGN_OR_RETURN(tls, TlsContext::ForClient(sc.security));
  }
  ASSIGN_OR_RETURN(
      DataPlaneConnection c,
      DialDataPlane({primary.host, static_cast<int>(dp.port()), dp.token()},
                    tls.get(), deadline));
  {
    absl::MutexLock lock(&mu_);
    if (stop_.HasBeenNotified()) return absl::CancelledError("stopping");
    follower_fd_ = c.socket.fd();
  }
  v1::ReplicaJoin join;
  join.set_epoch(epoch);
  join.set_member(member_);
  join.set_member_token(sc.security.member_token);
  FrameHeader header;
  header.op = FrameOp::kJoin;
  RETURN_IF_ERROR(WriteFrame(c.stream.get(), header, &join, {}, deadline));
  return ApplyStream(c.stream.get());
}

absl::Status ReplicaMember::ApplyStream(Stream* stream) {
  const ShardServerConfig& sc = server_->config();
  // Ops as big as a push or assign of the whole shard (a snapshot comes
  // in bounded chunks); the bound is the old one, with room to spare.
  const uint64_t max_op_bytes =
      3 * static_cast<uint64_t>(sc.max_shard_bytes) + (64 << 20);
  Replication* r = server_->replication();
  FrameHeader header;
  while (true) {
    RETURN_IF_ERROR(stream->WaitReadable(absl::InfiniteFuture()));
    const absl::Time deadline = absl::Now() + kFrameTimeout;
    ASSIGN_OR_RETURN(header, ReadHeader(stream, max_op_bytes, deadline));
    if (header.op == FrameOp::kAnswer && header.code != 0) {
      absl::Status refused;
      RETURN_IF_ERROR(ReadError(stream, header, deadline, &refused));
      return refused;
    }
    if (header.op != FrameOp::kReplicate) {
      return absl::InvalidArgumentError("the primary sent a frame not an op");
    }
    v1::ReplicaOp op;
    RETURN_IF_ERROR(ReadBody(
        stream, header, &op, [&] { return PayloadFields(&op); }, deadline));
    std::optional<uint64_t> applied;
    if (absl::Status s = r->Apply(&op, &applied); !s.ok()) {
      WriteError(stream, s, deadline).IgnoreError();
      return s;
    }
    if (!applied.has_value()) continue;  // Kept, or part of the snapshot.
    v1::ReplicaAck ack;
    ack.set_seq(*applied);
    header = FrameHeader();
    header.op = FrameOp::kAnswer;
    RETURN_IF_ERROR(WriteFrame(stream, header, &ack, {}, deadline));
  }
}

}  // namespace asyncps
