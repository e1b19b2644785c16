// psctl group init: creates the records of every shard's replicated group
// in etcd (server/replica/group_records.h), once, for a new job. ps_server
// members of a group with no records do not start, so a job's groups are
// created explicitly: this, or ps_server --bootstrap on one member.
#ifndef ASYNCPS_TOOLS_OPS_PSCTL_GROUP_H_
#define ASYNCPS_TOOLS_OPS_PSCTL_GROUP_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tools/ops/psctl_doctor_etcd.h"

namespace asyncps {

// `args`: what follows "group" on the command line. Returns the exit code.
int GroupCommand(const std::vector<std::string>& args);

// psctl doctor --etcd=H:P --job=NAME: the job as etcd holds it
// (ReadEtcdJob, each etcd call within min(--etcd_timeout, 3 s)); nullopt
// without --etcd; a bad --etcd_tls_* flag is the error.
absl::StatusOr<std::optional<EtcdJob>> EtcdJobFromFlags();

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_PSCTL_GROUP_H_
