// TaskQueue: one background thread running queued tasks in order. The
// exchanges use it to communicate while the trainer thread computes.
// Thread-safe.
#ifndef ASYNCPS_WORKER_TASK_QUEUE_H_
#define ASYNCPS_WORKER_TASK_QUEUE_H_

#include <deque>
#include <functional>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace asyncps {

class TaskQueue {
 public:
  TaskQueue();
  // Runs what is queued, then stops the thread.
  ~TaskQueue();

  // Queues `task`. After a task fails, the rest queued before the next
  // Drain are skipped.
  void Enqueue(std::function<absl::Status()> task);
  // Waits until every queued task has run; returns the first error since
  // the last Drain (and clears it).
  absl::Status Drain();

 private:
  void Run();

  absl::Mutex mu_;
  std::deque<std::function<absl::Status()>> tasks_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status error_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_TASK_QUEUE_H_
