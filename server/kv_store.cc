#include "server/kv_store.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {

absl::Status KvStore::Set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > 1024) {
    return absl::InvalidArgumentError("store key must be 1-1024 bytes");
  }
  if (value.size() > kMaxKvValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store value of ", value.size(), " bytes is over the ",
                     kMaxKvValueBytes, "-byte limit"));
  }
  std::vector<Waiter> ready;
  {
    absl::MutexLock lock(&mu_);
    if (values_.size() >= kMaxKvKeys && !values_.contains(key)) {
      return absl::ResourceExhaustedError("store is full");
    }
    values_[key] = std::move(value);
    std::vector<Waiter> keep;
    for (Waiter& w : waiters_) {
      if (w.key == key) {
        w.response->set_value(values_[key]);
        ready.push_back(std::move(w));
      } else {
        keep.push_back(std::move(w));
      }
    }
    waiters_.swap(keep);
  }
  for (Waiter& w : ready) w.reactor->Finish(grpc::Status::OK);
  return absl::OkStatus();
}

void KvStore::Get(grpc::CallbackServerContext* context,
                  const v1::StoreGetRequest* request,
                  v1::StoreGetResponse* response,
                  grpc::ServerUnaryReactor* reactor) {
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(request->key());
    if (it != values_.end()) {
      response->set_value(it->second);
    } else if (request->wait_ms() > 0) {
      const int64_t wait = std::min<int64_t>(request->wait_ms(), 3600 * 1000);
      waiters_.push_back(Waiter{request->key(),
                                absl::Now() + absl::Milliseconds(wait), context,
                                response, reactor});
      return;
    } else {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::NOT_FOUND,
          absl::StrCat("no key '", request->key(), "' in the store")));
      return;
    }
  }
  reactor->Finish(grpc::Status::OK);
}

void KvStore::Expire(absl::Time now) {
  std::vector<Waiter> expired;
  {
    absl::MutexLock lock(&mu_);
    if (waiters_.empty()) return;
    const auto wall = std::chrono::system_clock::now();
    std::vector<Waiter> keep;
    for (Waiter& w : waiters_) {
      if (now >= w.until || w.context->deadline() < wall ||
          w.context->IsCancelled()) {
        expired.push_back(std::move(w));
      } else {
        keep.push_back(std::move(w));
      }
    }
    waiters_.swap(keep);
  }
  for (Waiter& w : expired) {
    w.reactor->Finish(
        grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                     absl::StrCat("key '", w.key, "' was not set in time")));
  }
}

void KvStore::Shutdown() {
  std::vector<Waiter> held;
  {
    absl::MutexLock lock(&mu_);
    held.swap(waiters_);
  }
  for (Waiter& w : held) {
    w.reactor->Finish(
        grpc::Status(grpc::StatusCode::UNAVAILABLE, "server shutting down"));
  }
}

}  // namespace asyncps
