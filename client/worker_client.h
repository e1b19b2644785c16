// What ps_worker needs of a Client beyond the public header
// (include/asyncps/client.h), as a supported internal API of its own
// target (//client:worker_client, visible to worker/ and the tests):
// connecting with a timeline and in allreduce mode (where the servers only
// hold rank 0's copy), and the layers the Client is built on, for what
// only ps_worker does: allreduce's Assign and re-forming the ring
// (PsClient), the heartbeats' progress report and the rank's resumption
// point (MembershipClient). Not part of the stable API.
#ifndef ASYNCPS_CLIENT_WORKER_CLIENT_H_
#define ASYNCPS_CLIENT_WORKER_CLIENT_H_

#include <memory>

#include "absl/status/statusor.h"
#include "asyncps/client.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/timeline.h"

namespace asyncps {

struct WorkerClient {
  std::unique_ptr<Client> client;
  // The layers below `client`, borrowed from it. `membership` is null for
  // a reader (ClientOptions::worker = false).
  PsClient* ps = nullptr;
  MembershipClient* membership = nullptr;
};

// Client::Connect, also for mode "allreduce", with pulls and pushes drawn
// on `timeline` (borrowed; may be null).
absl::StatusOr<WorkerClient> ConnectWorker(const ClientOptions& options,
                                           Timeline* timeline);

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_WORKER_CLIENT_H_
