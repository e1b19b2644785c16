// What ps_worker needs of a Client beyond the public header
// (include/asyncps/client.h), as a supported internal API of its own
// target (//client:worker_client, visible to worker/ and the tests):
// connecting with a timeline and in allreduce mode (where the servers only
// hold rank 0's copy), and the layers the Client is built on, for what
// only ps_worker does: allreduce's Assign and re-forming the ring
// (PsClient), the heartbeats' progress report and the rank's resumption
// point (MembershipClient), and declaring the model from its proto. Not
// part of the stable API.
#ifndef ASYNCPS_CLIENT_WORKER_CLIENT_H_
#define ASYNCPS_CLIENT_WORKER_CLIENT_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "asyncps/client.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/timeline.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

struct WorkerClient {
  std::unique_ptr<Client> client;
  // The layers below `client`, borrowed from it. `membership` is null for
  // a reader (ClientOptions::worker = false).
  PsClient* ps = nullptr;
  MembershipClient* membership = nullptr;
  Client::Impl* impl = nullptr;  // client's, for DeclareSpec.
};

// Client::Connect, also for mode "allreduce", with pulls and pushes drawn
// on `timeline` (borrowed; may be null).
absl::StatusOr<WorkerClient> ConnectWorker(const ClientOptions& options,
                                           Timeline* timeline);

// Declares the model as the proto it is (ps_worker builds it once, with
// its initializers; Client::Declare is the same from public types), with
// `initial` weights (one buffer per tensor; the first declarer's win).
absl::Status DeclareSpec(const WorkerClient& worker, const v1::ModelSpec& spec,
                         const std::vector<absl::Span<const float>>& initial);

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_WORKER_CLIENT_H_
