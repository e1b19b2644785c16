#include "server/replica/etcd_coordinator.h"

#include <grpcpp/grpcpp.h>

#include <cmath>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "rpc/grpc_status.h"

namespace asyncps {
namespace {

CoordinatedValue FromKv(const etcdserverpb::KeyValue& kv) {
  return CoordinatedValue{kv.value(), kv.create_revision(), kv.mod_revision(),
                          kv.lease()};
}

// etcd's errors say "etcdserver: requested lease not found" as NOT_FOUND
// already; everything else keeps its code, with where it came from.
absl::Status Etcd(const grpc::Status& s, const char* what) {
  return Annotate(FromGrpcStatus(s), absl::StrCat("etcd ", what));
}

// The end of the range of every key that starts with `prefix`.
std::string PrefixEnd(std::string prefix) {
  while (!prefix.empty()) {
    if (static_cast<unsigned char>(prefix.back()) < 0xff) {
      prefix.back() = static_cast<char>(prefix.back() + 1);
      return prefix;
    }
    prefix.pop_back();
  }
  return std::string(1, '\0');  // Every key.
}

// A watch on etcd: its Watch stream, made again after it breaks, read on
// a thread of its own.
class EtcdWatch final : public Coordinator::Watch {
 public:
  EtcdWatch(etcdserverpb::Watch::Stub* stub, std::string prefix,
            std::function<void()> changed)
      : stub_(stub),
        prefix_(std::move(prefix)),
        changed_(std::move(changed)),
        thread_([this] { Run(); }) {}
  ~EtcdWatch() override {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
      if (context_ != nullptr) context_->TryCancel();
    }
    thread_.join();
  }

 private:
  // How long a broken stream waits before it is made again.
  static constexpr absl::Duration kRetry = absl::Milliseconds(100);

  void Run() {
    while (true) {
      grpc::ClientContext context;
      {
        absl::MutexLock lock(&mu_);
        if (stop_) return;
        context_ = &context;
      }
      Follow(&context);
      absl::MutexLock lock(&mu_);
      context_ = nullptr;
      mu_.AwaitWithTimeout(absl::Condition(&stop_), kRetry);
      if (stop_) return;
    }
  }

  // One stream, until it breaks or is cancelled.
  void Follow(grpc::ClientContext* context) {
    auto stream = stub_->Watch(context);
    etcdserverpb::WatchRequest request;
    etcdserverpb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(prefix_);
    create->set_range_end(PrefixEnd(prefix_));
    if (stream->Write(request)) {
      etcdserverpb::WatchResponse response;
      while (stream->Read(&response)) {
        // Created: whatever changed while no stream was up is looked at.
        if (response.created() || response.canceled() ||
            response.events_size() > 0) {
          changed_();
        }
        if (response.canceled()) break;
      }
    }
    context->TryCancel();
    stream->Finish().IgnoreError();  // Cancelled, or why it broke.
  }

  etcdserverpb::Watch::Stub* const stub_;
  const std::string prefix_;
  const std::function<void()> changed_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  grpc::ClientContext* context_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;  // Last: started once the rest is set.
};

}  // namespace

std::unique_ptr<Coordinator::Watch> EtcdCoordinator::WatchPrefix(
    const std::string& prefix, std::function<void()> changed) {
  return std::make_unique<EtcdWatch>(watch_.get(), prefix, std::move(changed));
}

EtcdCoordinator::EtcdCoordinator(const std::string& endpoint,
                                 absl::Duration timeout, const EtcdTls& tls)
    : timeout_(timeout) {
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (tls.on()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = tls.ca_pem;
    ssl.pem_cert_chain = tls.cert_pem;
    ssl.pem_private_key = tls.key_pem;
    credentials = grpc::SslCredentials(ssl);
  }
  // gRPC's reconnect backoff grows to 120 s: a channel that failed while
  // etcd was away would keep a member from it for many seconds after it
  // is back (10 s seen in a history run), holding up the election.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 500);
  auto channel = grpc::CreateCustomChannel(endpoint, credentials, args);
  kv_ = etcdserverpb::KV::NewStub(channel);
  lease_ = etcdserverpb::Lease::NewStub(channel);
  watch_ = etcdserverpb::Watch::NewStub(channel);
}

std::unique_ptr<grpc::ClientContext> EtcdCoordinator::Context() const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  return context;
}

absl::StatusOr<std::pair<int64_t, absl::Duration>> EtcdCoordinator::Grant(
    absl::Duration ttl) {
  etcdserverpb::LeaseGrantRequest request;
  request.set_ttl(static_cast<int64_t>(
      std::ceil(absl::ToDoubleSeconds(ttl))));  // Whole seconds.
  etcdserverpb::LeaseGrantResponse response;
  RETURN_IF_ERROR(
      Etcd(lease_->LeaseGrant(Context().get(), request, &response), "grant"));
  if (!response.error().empty()) {
    return absl::UnavailableError(
        absl::StrCat("etcd grant: ", response.error()));
  }
  return std::make_pair(response.id(), absl::Seconds(response.ttl()));
}

absl::Status EtcdCoordinator::KeepAlive(int64_t lease) {
  auto context = Context();
  auto stream = lease_->LeaseKeepAlive(context.get());
  etcdserverpb::LeaseKeepAliveRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseKeepAliveResponse response;
  const bool exchanged = stream->Write(request) && stream->Read(&response);
  stream->WritesDone();
  grpc::Status finished = stream->Finish();
  if (!exchanged) {
    return finished.ok() ? absl::UnavailableError("etcd keep-alive: no answer")
                         : Etcd(finished, "keep-alive");
  }
  // etcd answers a lease it no longer has with TTL 0.
  if (response.ttl() <= 0) {
    return absl::NotFoundError(absl::StrCat("etcd lease ", lease, " expired"));
  }
  return absl::OkStatus();
}

absl::Status EtcdCoordinator::Revoke(int64_t lease) {
  etcdserverpb::LeaseRevokeRequest request;
  request.set_id(lease);
  etcdserverpb::LeaseRevokeResponse response;
  return Etcd(lease_->LeaseRevoke(Context().get(), request, &response),
              "revoke");
}

absl::StatusOr<int64_t> EtcdCoordinator::CreateIfAbsent(
    const std::string& key, const std::string& value, int64_t lease) {
  // One transaction: if the key was never created (create revision 0), put
  // it, and read it back for its create revision; else nothing.
  etcdserverpb::TxnRequest request;
  etcdserverpb::Compare* absent = request.add_compare();
  absent->set_result(etcdserverpb::Compare::EQUAL);
  absent->set_target(etcdserverpb::Compare::CREATE);
  absent->set_key(key);
  absent->set_create_revision(0);
  etcdserverpb::PutRequest* put = request.add_success()->mutable_request_put();
  put->set_key(key);
  put->set_value(value);
  put->set_lease(lease);
  request.add_success()->mutable_request_range()->set_key(key);
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(Etcd(kv_->Txn(Context().get(), request, &response), "txn"));
  if (!response.succeeded()) return 0;
  if (response.responses_size() != 2 ||
      response.responses(1).response_range().kvs_size() != 1) {
    return absl::InternalError(
        absl::StrCat("etcd txn on ", key, ": an answer without the key"));
  }
  return response.responses(1).response_range().kvs(0).create_revision();
}

absl::Status EtcdCoordinator::Put(const std::string& key,
                                  const std::string& value, int64_t lease) {
  etcdserverpb::PutRequest request;
  request.set_key(key);
  request.set_value(value);
  request.set_lease(lease);
  etcdserverpb::PutResponse response;
  return Etcd(kv_->Put(Context().get(), request, &response), "put");
}

absl::Status EtcdCoordinator::PutIf(const std::vector<KeyRevision>& conditions,
                                    const std::vector<KeyPut>& puts) {
  etcdserverpb::TxnRequest request;
  for (const KeyPut& p : puts) {
    etcdserverpb::PutRequest* put =
        request.add_success()->mutable_request_put();
    put->set_key(p.key);
    put->set_value(p.value);
    put->set_lease(p.lease);
  }
  return TxnIf(conditions, &request);
}

absl::Status EtcdCoordinator::DeleteIf(
    const std::vector<KeyRevision>& conditions,
    const std::vector<std::string>& keys) {
  etcdserverpb::TxnRequest request;
  for (const std::string& key : keys) {
    request.add_success()->mutable_request_delete_range()->set_key(key);
  }
  return TxnIf(conditions, &request);
}

absl::Status EtcdCoordinator::TxnIf(const std::vector<KeyRevision>& conditions,
                                    etcdserverpb::TxnRequest* request) {
  for (const KeyRevision& c : conditions) {
    etcdserverpb::Compare* compare = request->add_compare();
    compare->set_result(etcdserverpb::Compare::EQUAL);
    compare->set_key(c.key);
    if (c.of == KeyRevision::Of::kCreate) {
      compare->set_target(etcdserverpb::Compare::CREATE);
      compare->set_create_revision(c.revision);
    } else {
      compare->set_target(etcdserverpb::Compare::MOD);
      compare->set_mod_revision(c.revision);
    }
  }
  etcdserverpb::TxnResponse response;
  RETURN_IF_ERROR(Etcd(kv_->Txn(Context().get(), *request, &response), "txn"));
  if (response.succeeded()) return absl::OkStatus();
  std::string keys;
  for (const KeyRevision& c : conditions) {
    absl::StrAppend(&keys, keys.empty() ? "" : ", ", c.key, " at ",
                    c.of == KeyRevision::Of::kCreate ? "create" : "mod",
                    " revision ", c.revision);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "etcd transaction refused: not every one of ", keys, " holds"));
}

absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>>
EtcdCoordinator::Range(const std::string& key, const std::string& range_end) {
  etcdserverpb::RangeRequest request;
  request.set_key(key);
  request.set_range_end(range_end);
  etcdserverpb::RangeResponse response;
  RETURN_IF_ERROR(
      Etcd(kv_->Range(Context().get(), request, &response), "range"));
  std::vector<std::pair<std::string, CoordinatedValue>> out;
  for (const etcdserverpb::KeyValue& kv : response.kvs()) {
    out.emplace_back(kv.key(), FromKv(kv));
  }
  return out;
}

absl::StatusOr<CoordinatedValue> EtcdCoordinator::Get(const std::string& key) {
  ASSIGN_OR_RETURN(auto found, Range(key, ""));
  if (found.empty()) return absl::NotFoundError(absl::StrCat("no key ", key));
  return found[0].second;
}

absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>>
EtcdCoordinator::List(const std::string& prefix) {
  return Range(prefix, PrefixEnd(prefix));
}

}  // namespace asyncps
