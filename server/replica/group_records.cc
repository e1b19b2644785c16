#include "server/replica/group_records.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/random_id.h"
#include "common/status_macros.h"

namespace asyncps {

std::string GroupKey(const std::string& prefix, int shard,
                     const std::string& name) {
  return absl::StrCat(prefix, "/shard/", shard, "/", name);
}

absl::StatusOr<bool> CreateGroup(Coordinator* coordinator,
                                 const std::string& prefix, int shard) {
  const std::string insync = GroupKey(prefix, shard, "insync");
  absl::Status s = coordinator->PutIf(
      {KeyRevision{insync, KeyRevision::Of::kCreate, 0}},
      {KeyPut{GroupKey(prefix, shard, "incarnation"), absl::StrCat(RandomId())},
       KeyPut{insync, "0:"}});
  if (absl::IsFailedPrecondition(s)) return false;  // It has them.
  RETURN_IF_ERROR(s);
  return true;
}

std::string NoGroupRecords(const std::string& prefix, int shard) {
  return absl::StrCat(
      "shard ", shard, ": the group has no records in the coordinator (no ",
      GroupKey(prefix, shard, "insync"),
      "), so no member may lead it: start one member of a new group with "
      "--bootstrap, or run `psctl group init`; if the coordinator lost its "
      "keys, the members' state may be lost too (docs/RELIABILITY.md, "
      "\"Replicated shards\")");
}

absl::StatusOr<uint64_t> GroupIncarnation(Coordinator* coordinator,
                                          const std::string& prefix,
                                          int shard) {
  const std::string key = GroupKey(prefix, shard, "incarnation");
  absl::StatusOr<CoordinatedValue> v = coordinator->Get(key);
  absl::Status insync =
      coordinator->Get(GroupKey(prefix, shard, "insync")).status();
  if (absl::IsNotFound(v.status()) || absl::IsNotFound(insync)) {
    return absl::FailedPreconditionError(NoGroupRecords(prefix, shard));
  }
  RETURN_IF_ERROR(v.status());
  RETURN_IF_ERROR(insync);
  uint64_t incarnation = 0;
  if (!absl::SimpleAtoi(v->value, &incarnation) || incarnation == 0) {
    return absl::DataLossError(absl::StrCat("coordinator key ", key, " holds '",
                                            v->value,
                                            "', not a shard incarnation"));
  }
  return incarnation;
}

}  // namespace asyncps
