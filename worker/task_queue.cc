#include "worker/task_queue.h"

#include <utility>

namespace asyncps {

TaskQueue::TaskQueue() : thread_([this] { Run(); }) {}

TaskQueue::~TaskQueue() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void TaskQueue::Run() {
  while (true) {
    std::function<absl::Status()> task;
    bool skip;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](TaskQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
            return q->stop_ || !q->tasks_.empty();
          },
          this));
      if (tasks_.empty()) return;  // Stopping, and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      skip = !error_.ok();
    }
    absl::Status s = skip ? absl::OkStatus() : task();
    absl::MutexLock lock(&mu_);
    --running_;
    if (!s.ok() && error_.ok()) error_ = s;
  }
}

void TaskQueue::Enqueue(std::function<absl::Status()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

absl::Status TaskQueue::Drain() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](TaskQueue* q) ABSL_EXCLUSIVE_LOCKS_REQUIRED(q->mu_) {
        return q->tasks_.empty() && q->running_ == 0;
      },
      this));
  absl::Status s = error_;
  error_ = absl::OkStatus();
  return s;
}

}  // namespace asyncps
