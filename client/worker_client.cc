#include "client/worker_client.h"

#include <utility>

#include "client/client_impl.h"
#include "common/status.h"

namespace asyncps {

absl::StatusOr<WorkerClient> ConnectWorker(const ClientOptions& options,
                                           Timeline* timeline) {
  ASSIGN_OR_RETURN(std::unique_ptr<Client::Impl> impl,
                   ConnectImpl(options, timeline));
  WorkerClient out;
  out.ps = impl->ps();
  out.membership = impl->membership();
  out.impl = impl.get();
  out.client = std::make_unique<Client>(std::move(impl));
  return out;
}

absl::Status DeclareSpec(const WorkerClient& worker, const v1::ModelSpec& spec,
                         const std::vector<absl::Span<const float>>& initial) {
  return worker.impl->DeclareSpec(spec, initial);
}

}  // namespace asyncps
