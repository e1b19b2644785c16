#include "tools/ops/psctl_doctor_etcd.h"

#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace asyncps {
namespace {

// What etcd holds of one shard's group.
struct Group {
  bool incarnation = false;
  bool insync = false;
  std::string primary;               // Its address; empty: none.
  std::vector<std::string> members;  // members/<address>, in key order.
};

Finding Problem(std::string text) { return Finding{true, std::move(text)}; }

// The shard's addresses, primary first; empty if it has none to ask.
std::vector<std::string> Addresses(const Group& g) {
  std::vector<std::string> out;
  if (!g.primary.empty()) out.push_back(g.primary);
  for (const std::string& m : g.members) {
    if (m != g.primary) out.push_back(m);
  }
  return out;
}

}  // namespace

EtcdJob ReadEtcdJob(Coordinator* etcd, const std::string& endpoint,
                    const std::string& prefix) {
  EtcdJob job;
  const std::string under = prefix + "/shard/";
  auto listed = etcd->List(under);
  if (!listed.ok()) {
    job.findings.push_back(Problem(absl::StrCat(
        "etcd at ", endpoint, " is unreachable (", listed.status().message(),
        "): the job's members cannot renew their leases nor elect a primary "
        "while it is; is etcd running there, and are --etcd_tls_* right?")));
    return job;
  }
  std::map<int, Group> groups;
  for (const auto& [key, value] : *listed) {
    absl::string_view rest = absl::StripPrefix(key, under);
    const std::vector<std::string> parts =
        absl::StrSplit(rest, absl::MaxSplits('/', 1));
    int shard = 0;
    if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], &shard) || shard < 0) {
      continue;  // Not a group's record.
    }
    Group& g = groups[shard];
    const std::string& name = parts[1];
    if (name == "incarnation") g.incarnation = true;
    if (name == "insync") g.insync = true;
    if (name == "primary") g.primary = value.value;
    if (absl::StartsWith(name, "members/")) {
      g.members.push_back(name.substr(8));
    }
  }
  if (groups.empty()) {
    job.findings.push_back(Problem(absl::StrCat(
        "etcd at ", endpoint, " holds no group of this job (nothing under ",
        under,
        "): is --job the members' --job? A new job's groups are made "
        "once, by psctl group init or ps_server --bootstrap")));
    return job;
  }
  bool all_addressed = true;
  const int shards = groups.rbegin()->first + 1;
  for (int s = 0; s < shards; ++s) {
    const auto it = groups.find(s);
    if (it == groups.end()) {
      job.findings.push_back(Problem(absl::StrCat(
          "shard ", s, " has nothing in etcd while shard ", shards - 1,
          " has: its group was never made (psctl group init --num_shards=",
          shards, ")")));
      all_addressed = false;
      continue;
    }
    const Group& g = it->second;
    if (!g.incarnation || !g.insync) {
      job.findings.push_back(Problem(absl::StrCat(
          "shard ", s, "'s group has no ", !g.incarnation ? "incarnation" : "",
          !g.incarnation && !g.insync ? " nor " : "", !g.insync ? "insync" : "",
          " record in etcd: no member will lead it (never made, or etcd "
          "lost its keys; psctl group init makes it again, but only if no "
          "member holds the shard's state)")));
    }
    if (g.members.empty()) {
      job.findings.push_back(Problem(
          absl::StrCat("shard ", s,
                       ": no member holds a lease in etcd (every ps_server "
                       "of the group is down, or cannot reach etcd)")));
    } else if (g.primary.empty()) {
      job.findings.push_back(Problem(
          absl::StrCat("shard ", s, " has no primary in etcd (members ",
                       absl::StrJoin(g.members, ", "), "): none is elected")));
    }
    const std::vector<std::string> addresses = Addresses(g);
    auto parsed = ParseServerList(absl::StrJoin(addresses, "|"));
    if (addresses.empty() || !parsed.ok() || parsed->size() != 1) {
      all_addressed = false;
      continue;
    }
    job.servers.push_back(parsed->front());
  }
  if (!all_addressed) job.servers.clear();
  return job;
}

}  // namespace asyncps
