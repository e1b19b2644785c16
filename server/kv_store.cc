#include "server/kv_store.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace asyncps {

absl::Status KvStore::Set(const std::string& key, std::string value) {
  if (key.empty() || key.size() > kMaxKvKeyBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store key must be 1-", kMaxKvKeyBytes, " bytes"));
  }
  if (value.size() > kMaxKvValueBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("store value of ", value.size(), " bytes is over the ",
                     kMaxKvValueBytes, "-byte limit"));
  }
  std::vector<HeldCalls<Wait>::Held> ready, expired;
  {
    absl::MutexLock lock(&mu_);
    const auto old = values_.find(key);
    const size_t replaced =
        old == values_.end() ? 0 : key.size() + old->second.size();
    if (old == values_.end() && values_.size() >= kMaxKvKeys) {
      return absl::ResourceExhaustedError(
          absl::StrCat("store is full: ", kMaxKvKeys, " keys"));
    }
    if (bytes_ - replaced + key.size() + value.size() > kMaxKvTotalBytes) {
      return absl::ResourceExhaustedError(
          absl::StrCat("store is full: ", bytes_, " of ", kMaxKvTotalBytes,
                       " bytes held, and the value has ", value.size()));
    }
    bytes_ += key.size() + value.size() - replaced;
    const std::string& stored = values_[key] = std::move(value);
    // Under mu_, so a Get cannot slip between the store and the sweep.
    waiters_.Sweep(
        absl::InfinitePast(),
        [&](const Wait& w) {
          if (w.key != key) return false;
          *w.value = stored;
          return true;
        },
        &ready, &expired);
  }
  for (auto& h : ready) h.call.done(absl::OkStatus());
  // The sweep also takes out calls whose caller has gone: each is still
  // answered (exactly once), or gRPC's shutdown would wait for it forever.
  AnswerExpired(&expired);
  return absl::OkStatus();
}

void KvStore::Get(const std::string& key, absl::Duration wait,
                  std::string* value, PendingCall call) {
  absl::Status answer;
  {
    absl::MutexLock lock(&mu_);
    auto it = values_.find(key);
    if (it != values_.end()) {
      *value = it->second;
    } else if (wait <= absl::ZeroDuration()) {
      answer =
          absl::NotFoundError(absl::StrCat("no key '", key, "' in the store"));
    } else {
      call.deadline =
          std::min(call.deadline, clock_->Now() + std::min(wait, kMaxKvWait));
      // Under mu_, so a Set cannot slip between the lookup and the hold.
      // (After Shutdown, Hold answers UNAVAILABLE here, under mu_.)
      waiters_.Hold({Wait{key, value}, std::move(call)});
      return;
    }
  }
  call.done(answer);
}

void KvStore::Expire() {
  std::vector<HeldCalls<Wait>::Held> ready, expired;
  waiters_.Sweep(
      clock_->Now(), [](const Wait&) { return false; }, &ready, &expired);
  AnswerExpired(&expired);
}

void KvStore::AnswerExpired(std::vector<HeldCalls<Wait>::Held>* expired) {
  for (auto& h : *expired) {
    if (h.call.cancelled && h.call.cancelled()) {
      h.call.done(absl::CancelledError(absl::StrCat(
          "the caller waiting for key '", h.what.key, "' has gone")));
    } else {
      h.call.done(absl::DeadlineExceededError(
          absl::StrCat("key '", h.what.key, "' was not set in time")));
    }
  }
}

void KvStore::Shutdown() { waiters_.Close(); }

}  // namespace asyncps
