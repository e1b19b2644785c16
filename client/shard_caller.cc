#include "client/shard_caller.h"

#include <chrono>

#include "absl/strings/cord.h"
#include "absl/synchronization/notification.h"
#include "common/random_id.h"
#include "rpc/grpc_credentials.h"

namespace asyncps {

namespace {
constexpr absl::string_view kNotWaitedFor = "asyncps.dev/not-waited-for";
}  // namespace

absl::Status ShardCaller::NotWaitedFor(int shard) {
  absl::Status s = absl::UnavailableError(absl::StrCat(
      "the answer of shard ", shard,
      " was not waited for: another shard's answer ended the attempt"));
  s.SetPayload(kNotWaitedFor, absl::Cord());
  return s;
}

bool ShardCaller::WasNotWaitedFor(const absl::Status& s) {
  return s.GetPayload(kNotWaitedFor).has_value();
}

ShardCaller::ShardCaller(PsClientOptions options)
    : options_(std::move(options)), client_id_(RandomId()) {}

absl::StatusOr<std::unique_ptr<ShardCaller>> ShardCaller::Create(
    PsClientOptions options) {
  if (options.servers.empty()) {
    return absl::InvalidArgumentError("a client needs at least one server");
  }
  if (options.max_message_bytes < 2 * kRequestOverhead) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_message_bytes ", options.max_message_bytes,
                     " is below the minimum ", 2 * kRequestOverhead));
  }
  std::unique_ptr<ShardCaller> client(new ShardCaller(std::move(options)));
  std::shared_ptr<const TlsContext> tls;
  if (client->options_.transport == Transport::kTcp &&
      client->options_.security.tls()) {
    ASSIGN_OR_RETURN(tls, TlsContext::ForClient(client->options_.security));
  }
  ShardCaller* c = client.get();
  c->current_ =
      std::make_unique<std::atomic<int>[]>(c->options_.servers.size());
  for (size_t shard = 0; shard < c->options_.servers.size(); ++shard) {
    c->current_[shard] = 0;
    std::vector<Member>& members = c->members_.emplace_back();
    for (const ServerAddress& addr : c->options_.servers[shard].Members()) {
      grpc::ChannelArguments args;
      args.SetMaxReceiveMessageSize(
          static_cast<int>(c->options_.max_message_bytes));
      args.SetMaxSendMessageSize(
          static_cast<int>(c->options_.max_message_bytes));
      // A restarted shard is found again within a second.
      args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
      args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
      Member& m = members.emplace_back();
      m.address = addr;
      m.stub = v1::ParameterServer::NewStub(grpc::CreateCustomChannel(
          addr.ToString(), MakeChannelCredentials(c->options_.security), args));
      if (c->options_.transport == Transport::kTcp) {
        const int s = static_cast<int>(shard);
        const int k = static_cast<int>(members.size()) - 1;
        m.data = std::make_unique<DataChannel>(
            [c, s, k](absl::Time deadline) {
              return c->DiscoverDataPlane(s, k, deadline);
            },
            tls, static_cast<uint64_t>(c->options_.max_message_bytes));
      }
    }
  }
  return client;
}

uint64_t ShardCaller::SecretFor(int shard, int rank) const {
  if (rank < 0) return 0;
  absl::MutexLock lock(&secrets_mu_);
  auto it = secrets_.find({shard, rank});
  return it == secrets_.end() ? 0 : it->second;
}

void ShardCaller::Stamp(int shard, v1::PullRequest* r) const {
  r->set_secret(SecretFor(shard, r->rank()));
}
void ShardCaller::Stamp(int shard, v1::PushRequest* r) const {
  r->set_secret(SecretFor(shard, r->rank()));
}
void ShardCaller::Stamp(int shard, v1::PushPullRequest* r) const {
  Stamp(shard, r->mutable_push());
}
void ShardCaller::Stamp(int shard, v1::AssignRequest* r) const {
  r->set_secret(SecretFor(shard, r->rank()));
}
void ShardCaller::Stamp(int shard, v1::DeclareModelRequest* r) const {
  StampAsThisRank(shard, r);
}
void ShardCaller::Stamp(int shard, v1::RegisterRequest* r) const {
  r->set_secret(SecretFor(shard, r->rank()));
}
void ShardCaller::Stamp(int shard, v1::HeartbeatRequest* r) const {
  r->set_secret(SecretFor(shard, r->rank()));
}
void ShardCaller::Stamp(int shard, v1::StoreSetRequest* r) const {
  StampAsThisRank(shard, r);
}
void ShardCaller::Stamp(int shard, v1::DeclareEmbeddingRequest* r) const {
  StampAsThisRank(shard, r);
}
void ShardCaller::Stamp(int shard, v1::PullRowsRequest* r) const {
  StampAsThisRank(shard, r);
}
void ShardCaller::Stamp(int shard, v1::PushRowsRequest* r) const {
  StampAsThisRank(shard, r);
}
void ShardCaller::Stamp(int shard, v1::ReadRowsRequest* r) const {
  StampAsThisRank(shard, r);
}

std::unique_ptr<grpc::ClientContext> ShardCaller::NewContext(
    absl::Time deadline) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(deadline));
  if (!options_.security.token.empty()) {
    context->AddMetadata(kAuthorizationKey,
                         BearerValue(options_.security.token));
  }
  if (!options_.security.admin_token.empty()) {
    context->AddMetadata(kAdminTokenKey, options_.security.admin_token);
  }
  return context;
}

void ShardCaller::NextMember(int shard, int tried) {
  const int n = static_cast<int>(members_[shard].size());
  if (n > 1) current_[shard].compare_exchange_strong(tried, (tried + 1) % n);
}

absl::StatusOr<DataPlaneAddress> ShardCaller::DiscoverDataPlane(
    int shard, int member, absl::Time deadline) {
  std::unique_ptr<grpc::ClientContext> context = NewContext(deadline);
  v1::DataPlaneRequest request;
  v1::DataPlaneResponse response;
  absl::Notification done;
  grpc::Status status;
  const Member& m = members_[shard][member];
  m.stub->async()->DataPlane(context.get(), &request, &response,
                             [&](grpc::Status s) {
                               status = std::move(s);
                               done.Notify();
                             });
  done.WaitForNotification();
  absl::Status s = FromGrpcStatus(status);
  if (s.code() == absl::StatusCode::kCancelled) {
    // Not this client's doing (nothing cancels this call): the server, a
    // member restarting or shutting down, cancelled the calls in flight.
    // Retried as the shard being away, as GrpcAttempt does.
    s = absl::UnavailableError(
        absl::StrCat("cancelled by the server (shutting down): ", s.message()));
  }
  RETURN_IF_ERROR(Annotate(s, "DataPlane"));
  DataPlaneAddress address;
  address.host = m.address.host;
  address.port = static_cast<int>(response.port());
  address.token = response.token();
  return address;
}

absl::StatusOr<v1::RegisterResponse> ShardCaller::Register(
    int shard, const v1::RegisterRequest& req) {
  ++registrations_started_;
  absl::StatusOr<v1::RegisterResponse> response = CallOne<v1::RegisterResponse>(
      shard, req, ASYNCPS_RPC(Register), "Register");
  if (response.ok()) {
    {
      absl::MutexLock lock(&secrets_mu_);
      secrets_[{shard, response->rank()}] = response->secret();
    }
    rank_ = response->rank();
  }
  ++registrations_ended_;
  return response;
}

}  // namespace asyncps
