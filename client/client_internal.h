// What ps_worker needs of an asyncps::Client beyond the public header
// (include/asyncps/client.h): connecting with a timeline and in allreduce
// mode (where the servers only hold rank 0's copy), and the layers the
// Client is built on, for what only ps_worker does (allreduce's Assign and
// re-forming the ring; the heartbeats' progress report; per-slice
// counters). Not part of the stable API.
#ifndef ASYNCPS_CLIENT_CLIENT_INTERNAL_H_
#define ASYNCPS_CLIENT_CLIENT_INTERNAL_H_

#include <memory>

#include "absl/status/statusor.h"
#include "asyncps/client.h"
#include "client/membership_client.h"
#include "client/ps_client.h"
#include "common/timeline.h"

namespace asyncps {

struct ClientInternals {
  // Client::Connect, also for mode "allreduce", with pulls and pushes drawn
  // on `timeline` (borrowed; may be null).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options, Timeline* timeline);
  // The layers below `client`; borrowed from it. membership() is null for
  // a reader (ClientOptions::worker = false).
  static PsClient* ps(const Client& client);
  static MembershipClient* membership(const Client& client);
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_CLIENT_INTERNAL_H_
