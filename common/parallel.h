// ParallelFor: a CPU-bound loop split over threads, for the few places
// where one call does tens of milliseconds of memory-bound work that one
// core cannot keep up with (a GPU worker's staging copies, the encoding of
// a large compressed push). Threads are started per call: worth it only
// for work far above their ~50 us start; callers decide when.
#ifndef ASYNCPS_COMMON_PARALLEL_H_
#define ASYNCPS_COMMON_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <thread>
#include <vector>

namespace asyncps {

// Threads a call may use: the machine's cores, at most 8 (memory-bound
// work gains little past that).
inline size_t ParallelThreads() {
  static const size_t threads =
      std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8);
  return threads;
}

// Calls fn(i) for every i in [0, n), on up to `threads` threads (the
// caller's among them), each taking the next i as it finishes one, so
// items of unequal cost balance. Returns when all are done. `fn` must be
// safe to call concurrently for different i.
template <typename Fn>
void ParallelFor(size_t n, size_t threads, const Fn& fn) {
  threads = std::min(threads, n);
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  };
  std::vector<std::thread> helpers;
  helpers.reserve(threads - 1);
  for (size_t t = 1; t < threads; ++t) helpers.emplace_back(work);
  work();
  for (std::thread& t : helpers) t.join();
}

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_PARALLEL_H_
