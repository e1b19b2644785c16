// psctl doctor --etcd=H:P --job=NAME (issue #44): a replicated job found
// through etcd instead of --servers. Reads the job's group records
// (server/replica/replica_member.h lists them) and names what is wrong in
// them; the members found are then probed as --servers would be.
#ifndef ASYNCPS_TOOLS_OPS_PSCTL_DOCTOR_ETCD_H_
#define ASYNCPS_TOOLS_OPS_PSCTL_DOCTOR_ETCD_H_

#include <string>
#include <vector>

#include "common/cluster_spec.h"
#include "server/replica/coordinator.h"
#include "tools/ops/psctl_doctor.h"

namespace asyncps {

struct EtcdJob {
  // Shard s's members (`members/<address>`), its primary first; empty
  // when some shard has none to ask (then nothing is probed).
  std::vector<ServerAddress> servers;
  std::vector<Finding> findings;
};

// The job under `prefix` ("/asyncps/<job>") as `etcd` (at `endpoint`, for
// the words) holds it. Names, each as a problem: etcd unreachable (and
// then nothing else), no group of the job at all, a shard missing between
// others, a group without its records (`incarnation`, `insync`: never
// created, or etcd lost them), a group without a primary, a group none of
// whose members holds a lease (every member down or cut off from etcd).
EtcdJob ReadEtcdJob(Coordinator* etcd, const std::string& endpoint,
                    const std::string& prefix);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_PSCTL_DOCTOR_ETCD_H_
