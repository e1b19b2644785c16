// A replicated shard group's records in the coordinator, under
// `<prefix>/shard/<s>/` (server/replica/replica_member.h lists them all).
// A group is created once, explicitly (ps_server --bootstrap on a new
// group's first start, or `psctl group init`): a member that finds no
// records neither leads nor invents them, because after a coordinator lost
// its keys a member with no state could otherwise be elected over a backup
// holding the shard (docs/RELIABILITY.md "Replicated shards").
#ifndef ASYNCPS_SERVER_REPLICA_GROUP_RECORDS_H_
#define ASYNCPS_SERVER_REPLICA_GROUP_RECORDS_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/replica/coordinator.h"

namespace asyncps {

// The key `name` of shard `shard`'s group under `prefix`.
std::string GroupKey(const std::string& prefix, int shard,
                     const std::string& name);

// Creates the records of a new group (a fresh incarnation, and `insync`
// at epoch 0, which any member may lead) in one transaction, unless the
// group has them. Returns whether it created them.
absl::StatusOr<bool> CreateGroup(Coordinator* coordinator,
                                 const std::string& prefix, int shard);

// The group's incarnation; FAILED_PRECONDITION saying how to create the
// group if it has no records.
absl::StatusOr<uint64_t> GroupIncarnation(Coordinator* coordinator,
                                          const std::string& prefix, int shard);

// Why a member does not lead a group with no records (a log line).
std::string NoGroupRecords(const std::string& prefix, int shard);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_GROUP_RECORDS_H_
