// A ps_worker's run once its flags are parsed and checked
// (worker/ps_worker_main.cc): the device, the data, the servers, then
// training (--role=worker) or scoring (--role=evaluator).
#ifndef ASYNCPS_WORKER_WORKER_RUN_H_
#define ASYNCPS_WORKER_WORKER_RUN_H_

#include <atomic>

#include "absl/status/status.h"
#include "absl/synchronization/notification.h"
#include "worker/worker_config.h"

namespace asyncps {

// Runs `config` (WorkerConfig::Parse's) to the end: training stops after
// the current step once `stop` is set; the evaluator scores once more and
// exits when `stopped` is notified. `*refused_at_start` says whether an error
// came before the job was joined (a bad device, data that cannot be trained on,
// a busy metrics port: ps_worker exits 2 then, else 1).
absl::Status RunWorker(const WorkerConfig& config, std::atomic<bool>* stop,
                       absl::Notification* stopped, bool* refused_at_start);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_WORKER_RUN_H_
