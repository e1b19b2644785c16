// EtcdCoordinator: the Coordinator (server/replica/coordinator.h) on a real
// etcd, over its v3 gRPC API (stubs generated from etcd's own protos, the part
// we call: third_party/etcd/rpc.proto). gRPC rather than etcd's JSON gateway
// because asyncps already builds and links gRPC and protobuf: typed messages,
// no HTTP/JSON client and no base64 keys to hand-write, and the same deadlines
// and status codes as every other call here. A lease's keep-alive is one
// message each way on etcd's LeaseKeepAlive stream; a watch is etcd's
// Watch stream. Every call has a
// deadline (`timeout`); an unreachable etcd is UNAVAILABLE. Thread-safe.
#ifndef ASYNCPS_SERVER_REPLICA_ETCD_COORDINATOR_H_
#define ASYNCPS_SERVER_REPLICA_ETCD_COORDINATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/replica/coordinator.h"
#include "third_party/etcd/rpc.grpc.pb.h"

namespace asyncps {

// TLS to etcd (ps_server and psctl --etcd_tls_ca, --etcd_tls_cert,
// --etcd_tls_key: server/replica/etcd_flags.h): etcd's certificate is
// checked against `ca_pem` and the endpoint's name, and `cert_pem` with
// `key_pem` is the client certificate etcd's --client-cert-auth asks for.
// No CA: plain TCP.
struct EtcdTls {
  std::string ca_pem;
  std::string cert_pem;
  std::string key_pem;
  bool on() const { return !ca_pem.empty(); }
};

class EtcdCoordinator final : public Coordinator {
 public:
  // `endpoint`: etcd's client URL's host:port (e.g. "127.0.0.1:2379"),
  // over TLS when `tls.on()`, else plain TCP (etcd's client port on a
  // private network).
  explicit EtcdCoordinator(const std::string& endpoint,
                           absl::Duration timeout = absl::Seconds(2),
                           const EtcdTls& tls = EtcdTls());

  absl::StatusOr<std::pair<int64_t, absl::Duration>> Grant(
      absl::Duration ttl) override;
  absl::Status KeepAlive(int64_t lease) override;
  absl::Status Revoke(int64_t lease) override;
  absl::StatusOr<int64_t> CreateIfAbsent(const std::string& key,
                                         const std::string& value,
                                         int64_t lease) override;
  absl::Status Put(const std::string& key, const std::string& value,
                   int64_t lease) override;
  absl::Status PutIf(const std::vector<KeyRevision>& conditions,
                     const std::vector<KeyPut>& puts) override;
  absl::Status DeleteIf(const std::vector<KeyRevision>& conditions,
                        const std::vector<std::string>& keys) override;
  absl::StatusOr<CoordinatedValue> Get(const std::string& key) override;
  absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>> List(
      const std::string& prefix) override;
  // etcd's Watch stream on the prefix's range, on a thread of its own;
  // made again 100 ms after it breaks (etcd away, a compaction).
  std::unique_ptr<Watch> WatchPrefix(const std::string& prefix,
                                     std::function<void()> changed) override;

 private:
  std::unique_ptr<grpc::ClientContext> Context() const;
  // Sends `request` (its success ops set) with `conditions` as its
  // compares; FAILED_PRECONDITION naming them if they did not hold.
  absl::Status TxnIf(const std::vector<KeyRevision>& conditions,
                     etcdserverpb::TxnRequest* request);
  absl::StatusOr<std::vector<std::pair<std::string, CoordinatedValue>>> Range(
      const std::string& key, const std::string& range_end);

  const absl::Duration timeout_;
  std::unique_ptr<etcdserverpb::KV::Stub> kv_;
  std::unique_ptr<etcdserverpb::Lease::Stub> lease_;
  std::unique_ptr<etcdserverpb::Watch::Stub> watch_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_ETCD_COORDINATOR_H_
