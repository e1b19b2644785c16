// KvStore: a small key-value store for the Gloo rendezvous of allreduce
// workers. A Get may wait for its key; waiting calls are held, not blocking
// a thread. Thread-safe.
#ifndef ASYNCPS_SERVER_KV_STORE_H_
#define ASYNCPS_SERVER_KV_STORE_H_

#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

inline constexpr size_t kMaxKvValueBytes = 1 << 20;
inline constexpr size_t kMaxKvKeys = 100000;

class KvStore {
 public:
  // INVALID_ARGUMENT for an empty key or a value over kMaxKvValueBytes;
  // RESOURCE_EXHAUSTED past kMaxKvKeys.
  absl::Status Set(const std::string& key, std::string value);
  // Answers through `reactor`: the value, NOT_FOUND, or after waiting up to
  // wait_ms (and the call's deadline) DEADLINE_EXCEEDED.
  void Get(grpc::CallbackServerContext* context,
           const v1::StoreGetRequest* request, v1::StoreGetResponse* response,
           grpc::ServerUnaryReactor* reactor);
  // Answers waiting Gets whose time is up.
  void Expire(absl::Time now);
  // Answers every waiting Get with UNAVAILABLE.
  void Shutdown();

 private:
  struct Waiter {
    std::string key;
    absl::Time until;
    grpc::CallbackServerContext* context;
    v1::StoreGetResponse* response;
    grpc::ServerUnaryReactor* reactor;
  };
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::vector<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_KV_STORE_H_
