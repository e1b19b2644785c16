#include "worker/exchange_factory.h"

#include <utility>

#include "worker/allreduce_exchange.h"
#include "worker/local_steps_exchange.h"
#include "worker/ps_exchange.h"

namespace asyncps {

std::unique_ptr<GradientExchange> MakeExchange(
    const WorkerConfig& config, const WorkerClient& worker, int cuda_device,
    std::vector<std::vector<int>> layer_tensors,
    const std::atomic<bool>* stop) {
  if (config.mode != Mode::kAllreduce) {
    auto exchange = std::make_unique<PsExchange>(
        worker.client.get(), layer_tensors, config.Exchange(),
        /*steps=*/config.mode == Mode::kBsp);
    // The shards draw the same initial weights from the spec's
    // initializers as ps_worker's declaration did.
    PsExchange::LostModelAtStart lost;
    lost.declare = [ps = worker.ps] { return ps->DeclareModel(ps->spec()); };
    exchange->set_lost_model_at_start(std::move(lost));
    if (config.outer.kind == WorkerConfig::Outer::kNone) return exchange;
    LocalStepsConfig local;
    local.outer = config.outer.kind == WorkerConfig::Outer::kEasgd
                      ? LocalStepsConfig::kEasgd
                      : LocalStepsConfig::kDiloco;
    local.local_steps = config.outer.local_steps;
    local.inner = config.optimizer;
    local.alpha = config.outer.alpha;
    local.dynamic = config.outer.dynamic;
    local.fastest = [client = worker.client.get()] {
      return client->FastestStepsPerSecond();
    };
    return std::make_unique<LocalStepsExchange>(local, std::move(exchange),
                                                std::move(layer_tensors));
  }
  AllreduceConfig ar;
  ar.rank = config.rank;
  ar.num_workers = config.num_workers;
  ar.host = config.collective_host;
  ar.timeout = config.collective_timeout;
  ar.assign_every = config.assign_every;
  ar.cuda_device = cuda_device;
  ar.reform = true;
  ar.collective = config.CollectiveKind(cuda_device);
  ar.f16 = config.compress.kind == Compression::kF16;
  if (worker.membership != nullptr && worker.membership->elastic()) {
    ar.elastic = true;
    ar.live = [m = worker.membership] { return m->live_ranks(); };
    ar.leaving = stop;
  }
  return std::make_unique<AllreduceExchange>(worker.ps, ar,
                                             std::move(layer_tensors));
}

}  // namespace asyncps
