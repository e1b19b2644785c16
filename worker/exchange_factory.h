// The GradientExchange a worker's --mode calls for.
#ifndef ASYNCPS_WORKER_EXCHANGE_FACTORY_H_
#define ASYNCPS_WORKER_EXCHANGE_FACTORY_H_

#include <atomic>
#include <memory>
#include <vector>

#include "client/worker_client.h"
#include "worker/exchange.h"
#include "worker/worker_config.h"

namespace asyncps {

// allreduce: an AllreduceExchange over the collective of --collective
// (nccl chosen by "auto" when `cuda_device` >= 0); otherwise a PsExchange
// through the servers. An allreduce ring re-forms after a peer died (see
// AllreduceConfig; in an elastic job it grows and shrinks, and `stop`, set,
// makes the worker leave it after the step). `layer_tensors` come from the
// model. `worker` and `stop` are borrowed and must outlive the exchange.
// `config` comes from WorkerConfig::Parse.
std::unique_ptr<GradientExchange> MakeExchange(
    const WorkerConfig& config, const WorkerClient& worker, int cuda_device,
    std::vector<std::vector<int>> layer_tensors, const std::atomic<bool>* stop);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_EXCHANGE_FACTORY_H_
