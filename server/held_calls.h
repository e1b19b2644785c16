// Calls a server answers later, and the one waiting list both kinds of held
// call (ssp/bsp pulls, rendezvous gets) share. Nothing here knows gRPC: the
// service turns a gRPC call into a PendingCall at the edge.
#ifndef ASYNCPS_SERVER_HELD_CALLS_H_
#define ASYNCPS_SERVER_HELD_CALLS_H_

#include <functional>
#include <limits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace asyncps {

// How to answer one call, and until when it may wait.
struct PendingCall {
  // After this the call is answered DEADLINE_EXCEEDED (absl::InfiniteFuture()
  // for none).
  absl::Time deadline = absl::InfiniteFuture();
  // True once the caller has gone (may be empty: never).
  std::function<bool()> cancelled;
  // Answers the call; called exactly once.
  std::function<void(absl::Status)> done;

  bool Expired(absl::Time now) const {
    return now > deadline || (cancelled && cancelled());
  }
};

// A list of held calls, each with data `T` saying what it waits for.
// Thread-safe; callbacks are run outside the lock by the caller.
template <typename T>
class HeldCalls {
 public:
  struct Held {
    T what;
    PendingCall call;
  };

  // Holds `held`. After Close it answers the call UNAVAILABLE ("server
  // shutting down") instead, outside the lock.
  void Hold(Held held) {
    HoldIfFewer(&held, std::numeric_limits<size_t>::max(),
                [](const T&) { return false; });
  }

  // Takes out every call for which `ready(what)` holds into `ready_out`,
  // and every other one whose deadline passed or whose caller left into
  // `expired_out`. `ready` runs under this list's lock.
  template <typename Ready>
  void Sweep(absl::Time now, Ready ready, std::vector<Held>* ready_out,
             std::vector<Held>* expired_out) {
    absl::MutexLock lock(&mu_);
    if (items_.empty()) return;
    std::vector<Held> keep;
    for (Held& h : items_) {
      if (ready(h.what)) {
        ready_out->push_back(std::move(h));
      } else if (h.call.Expired(now)) {
        expired_out->push_back(std::move(h));
      } else {
        keep.push_back(std::move(h));
      }
    }
    items_.swap(keep);
  }

  // Answers every held call UNAVAILABLE, and every later one Hold is given.
  void Close() {
    std::vector<Held> held;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      held.swap(items_);
    }
    for (Held& h : held) h.call.done(ShuttingDown());
  }

  size_t size() {
    absl::MutexLock lock(&mu_);
    return items_.size();
  }
  // Holds `held` (as Hold does, closed included) only if fewer than
  // `limit` of the calls held now satisfy `same(what)`, and returns true;
  // otherwise returns false, leaving `held` with the caller unanswered.
  template <typename Same>
  bool HoldIfFewer(Held* held, size_t limit, Same same) {
    {
      absl::MutexLock lock(&mu_);
      if (!closed_) {
        size_t n = 0;
        for (const Held& h : items_) n += same(h.what) ? 1 : 0;
        if (n >= limit) return false;
        items_.push_back(std::move(*held));
        return true;
      }
    }
    held->call.done(ShuttingDown());
    return true;
  }

 private:
  static absl::Status ShuttingDown() {
    return absl::UnavailableError("server shutting down");
  }

  absl::Mutex mu_;
  std::vector<Held> items_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_HELD_CALLS_H_
