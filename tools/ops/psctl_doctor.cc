#include "tools/ops/psctl_doctor.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/build_info.h"
#include "common/security.h"
#include "transport/socket.h"
#include "transport/tls.h"

namespace asyncps {
namespace {

std::string Who(const ShardProbe& p) {
  return p.member < 0 ? absl::StrCat("shard ", p.shard, " at ", p.address)
                      : absl::StrCat("shard ", p.shard, " member ", p.member,
                                     " at ", p.address);
}

std::string GiB(uint64_t bytes) {
  return absl::StrFormat("%.2f GiB", static_cast<double>(bytes) / (1 << 30));
}

// A call that did not answer: why, in the words an operator acts on.
Finding Unanswered(const ShardProbe& p) {
  const std::string why(p.status.message());
  const std::string lower = absl::AsciiStrToLower(why);
  if (p.speaks_tls) {
    return {true, absl::StrCat("TLS mismatch with ", Who(p),
                               ": it speaks TLS and psctl called in "
                               "plaintext (",
                               why,
                               "). Give psctl (and the workers) the shards' "
                               "CA with --tls_ca and, with mutual TLS, a "
                               "client certificate (--tls_cert, --tls_key)")};
  }
  if (absl::StrContains(lower, "ssl") || absl::StrContains(lower, "tls") ||
      absl::StrContains(lower, "handshake") ||
      absl::StrContains(lower, "certificate")) {
    return {true, absl::StrCat("TLS mismatch with ", Who(p), ": ", why,
                               ". psctl and the workers need the shards' CA "
                               "(--tls_ca) and, with mutual TLS, a client "
                               "certificate; a shard without --tls_cert "
                               "speaks plaintext")};
  }
  switch (p.status.code()) {
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return {true, absl::StrCat(Who(p), " refuses psctl's credentials: ", why,
                                 ". Give psctl (and the workers) the token the "
                                 "shard was started with (--auth_token_file)")};
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      return {true,
              absl::StrCat(Who(p), " is unreachable or not serving: ", why,
                           ". Is ps_server running there, on that port, "
                           "and done restoring its checkpoint?")};
    default:
      return {true, absl::StrCat(Who(p), " answered ",
                                 absl::StatusCodeToString(p.status.code()),
                                 ": ", why)};
  }
}

// What one shard's own answer says.
void OneShard(const ShardProbe& p, const DoctorContext& c,
              std::vector<Finding>* out) {
  const v1::StatsResponse& s = p.stats;
  if (s.awaiting_restore()) {
    out->push_back(
        {true, absl::StrCat(Who(p),
                            " waits for a worker's copy of its weights (it "
                            "restarted without a checkpoint, or the model "
                            "was declared with weights to follow) and "
                            "refuses pushes and pulls until one comes or "
                            "--restore_wait passes")});
  }
  if (!s.stall().empty()) {
    out->push_back({true, absl::StrCat(Who(p), ": ", s.stall())});
  }
  // The shard's clock now: its start plus its uptime, against the middle
  // of the call on this host's.
  const double rtt = absl::ToDoubleSeconds(p.answered - p.asked);
  const double here =
      absl::ToDoubleSeconds(p.asked - absl::UnixEpoch()) + rtt / 2;
  const double there = s.start_timestamp_seconds() + s.uptime_seconds();
  const double skew = there - here;
  if (s.start_timestamp_seconds() > 0 &&
      std::abs(skew) > absl::ToDoubleSeconds(c.clock_skew) + rtt) {
    out->push_back(
        {true, absl::StrFormat("%s: its clock is %.1f s %s this host's: "
                               "timestamps in logs, checkpoints and progress "
                               "lines disagree across hosts (run NTP)",
                               Who(p), std::abs(skew),
                               skew > 0 ? "ahead of" : "behind")});
  }
  if (s.max_shard_bytes() > 0 &&
      s.num_bytes() >= c.memory_share * s.max_shard_bytes()) {
    out->push_back(
        {true, absl::StrCat(Who(p), " holds ", GiB(s.num_bytes()),
                            " of weights, near its --max_shard_bytes of ",
                            GiB(s.max_shard_bytes()),
                            ": a bigger model or more embedding rows will "
                            "be refused (add shards)")});
  }
  if (s.memory_limit_bytes() > 0 &&
      s.rss_bytes() >= c.memory_share * s.memory_limit_bytes()) {
    out->push_back({true, absl::StrCat(Who(p), " uses ", GiB(s.rss_bytes()),
                                       " of its container's memory limit of ",
                                       GiB(s.memory_limit_bytes()),
                                       ": near the OOM killer")});
  }
}

// Each replicated shard: a primary, and enough members in sync.
void Groups(const std::vector<ShardProbe>& probes, std::vector<Finding>* out) {
  std::map<int, std::vector<const ShardProbe*>> groups;
  for (const ShardProbe& p : probes) {
    if (p.member >= 0) groups[p.shard].push_back(&p);
  }
  for (const auto& [shard, members] : groups) {
    const ShardProbe* primary = nullptr;
    std::vector<std::string> seen;
    for (const ShardProbe* m : members) {
      if (!m->status.ok()) {
        seen.push_back(absl::StrCat(m->address, " unreachable"));
        continue;
      }
      const v1::ReplicaStats& r = m->stats.replica();
      seen.push_back(absl::StrCat(m->address, " ", r.role()));
      if (r.role() == "primary") primary = m;
    }
    for (const ShardProbe* m : members) {
      if (!m->status.ok() || m->stats.replica().coordinator_error().empty()) {
        continue;
      }
      out->push_back(
          {true, absl::StrFormat(
                     "%s cannot reach etcd (failing for %.0f s): %s; a "
                     "primary that cannot renew its lease stops serving, and "
                     "no member is promoted while etcd is away",
                     Who(*m), m->stats.replica().coordinator_failing_seconds(),
                     m->stats.replica().coordinator_error())});
    }
    if (primary == nullptr) {
      out->push_back(
          {true, absl::StrCat("shard ", shard, "'s group has no primary (",
                              absl::StrJoin(seen, ", "),
                              "): no push is taken until one is "
                              "elected; is etcd reachable?")});
      continue;
    }
    const v1::ReplicaStats& r = primary->stats.replica();
    if (r.in_sync() < r.min_insync()) {
      out->push_back(
          {true, absl::StrCat("shard ", shard, "'s group has ", r.in_sync(),
                              " member(s) in sync, below its --min_insync of ",
                              r.min_insync(),
                              ": the primary refuses pushes until a backup "
                              "catches up (",
                              absl::StrJoin(seen, ", "), ")")});
    }
  }
}

// Workers as the shards saw them: NaN pushes, ranks gone.
void Workers(const std::vector<ShardProbe>& probes, const DoctorContext& c,
             std::vector<Finding>* out) {
  std::map<int, std::pair<int64_t, double>> nonfinite;  // Count, age.
  for (const ShardProbe& p : probes) {
    if (!p.status.ok()) continue;
    for (const v1::WorkerInfo& w : p.stats.workers()) {
      if (w.nonfinite_pushes() == 0 ||
          w.seconds_since_nonfinite() >
              absl::ToDoubleSeconds(c.nonfinite_window)) {
        continue;
      }
      auto [it, first] = nonfinite.try_emplace(w.rank(), w.nonfinite_pushes(),
                                               w.seconds_since_nonfinite());
      if (!first) {
        it->second.first += w.nonfinite_pushes();
        it->second.second =
            std::min(it->second.second, w.seconds_since_nonfinite());
      }
    }
  }
  for (const auto& [rank, seen] : nonfinite) {
    out->push_back(
        {true, absl::StrFormat("rank %d pushed NaN or Inf %d time(s), the "
                               "last %.0f s ago: the shards refuse those "
                               "pushes and its training diverged (lower its "
                               "learning rate, check its data)",
                               rank, seen.first, seen.second)});
  }
}

// The builds: every shard alike, and psctl's.
void Builds(const std::vector<ShardProbe>& probes, const DoctorContext& c,
            std::vector<Finding>* out) {
  std::map<std::string, std::vector<std::string>> builds;
  for (const ShardProbe& p : probes) {
    if (!p.status.ok() || p.stats.version().empty()) continue;
    builds[absl::StrCat(p.stats.version(), " (", p.stats.commit(), ")")]
        .push_back(p.member < 0 ? absl::StrCat(p.shard)
                                : absl::StrCat(p.shard, "/", p.member));
  }
  if (builds.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [build, shards] : builds) {
      parts.push_back(
          absl::StrCat("shard(s) ", absl::StrJoin(shards, ","), ": ", build));
    }
    out->push_back({true, absl::StrCat("the shards run different builds (",
                                       absl::StrJoin(parts, "; "),
                                       "): run one release everywhere")});
  } else if (builds.size() == 1 &&
             builds.begin()->first !=
                 absl::StrCat(c.version, " (", c.commit, ")") &&
             !c.version.empty()) {
    out->push_back(
        {false, absl::StrCat("the shards run ", builds.begin()->first,
                             ", psctl ", c.version, " (", c.commit, ")")});
  }
}

}  // namespace

std::vector<Finding> Diagnose(const std::vector<ShardProbe>& probes,
                              const DoctorContext& context) {
  std::vector<Finding> out;
  for (const ShardProbe& p : probes) {
    if (!p.status.ok()) {
      out.push_back(Unanswered(p));
    } else {
      OneShard(p, context, &out);
    }
  }
  Groups(probes, &out);
  Workers(probes, context, &out);
  Builds(probes, context, &out);
  return out;
}

bool SpeaksTls(const ServerAddress& address, absl::Time deadline) {
  absl::StatusOr<Socket> socket =
      ConnectTcp(address.host, address.port, deadline);
  if (!socket.ok()) return false;
  absl::StatusOr<std::shared_ptr<const TlsContext>> tls =
      TlsContext::ForClient(Security{});
  if (!tls.ok()) return false;
  absl::StatusOr<std::unique_ptr<Stream>> stream =
      (*tls)->Connect(socket->fd(), address.host, deadline);
  if (stream.ok()) return true;
  // The system's roots do not vouch for a cluster's own CA: a failed
  // verification is a TLS server all the same.
  const std::string why = absl::AsciiStrToLower(stream.status().message());
  return absl::StrContains(why, "certificate") ||
         absl::StrContains(why, "verify");
}

std::vector<ShardProbe> ProbeShards(AdminClient* admin,
                                    const std::vector<ServerAddress>& servers,
                                    bool tls) {
  std::vector<ShardProbe> probes;
  std::vector<ServerAddress> addresses;
  for (size_t s = 0; s < servers.size(); ++s) {
    const std::vector<ServerAddress> members = servers[s].Members();
    for (size_t m = 0; m < members.size(); ++m) {
      ShardProbe p;
      p.shard = static_cast<int>(s);
      p.member = members.size() > 1 ? static_cast<int>(m) : -1;
      p.address = members[m].ToString();
      probes.push_back(std::move(p));
      addresses.push_back(members[m]);
    }
  }
  std::vector<std::thread> calls;
  for (size_t i = 0; i < probes.size(); ++i) {
    calls.emplace_back([admin, tls, &p = probes[i], &a = addresses[i]] {
      p.asked = absl::Now();
      absl::StatusOr<v1::StatsResponse> s =
          p.member < 0 ? admin->Stats(p.shard)
                       : admin->MemberStats(p.shard, p.member);
      p.answered = absl::Now();
      p.status = s.status();
      if (s.ok()) p.stats = *std::move(s);
      if (!tls && absl::IsUnavailable(p.status)) {
        p.speaks_tls = SpeaksTls(a, absl::Now() + absl::Seconds(2));
      }
    });
  }
  for (std::thread& t : calls) t.join();
  return probes;
}

int PrintFindings(const std::vector<Finding>& findings) {
  bool problem = false;
  for (const Finding& f : findings) {
    std::printf("%s: %s\n", f.problem ? "PROBLEM" : "note", f.text.c_str());
    problem = problem || f.problem;
  }
  return problem ? 1 : 0;
}

int DoctorCommand(AdminClient* admin, const std::vector<ServerAddress>& servers,
                  bool tls, std::vector<Finding> first) {
  const std::vector<ShardProbe> probes = ProbeShards(admin, servers, tls);
  DoctorContext context;
  context.version = kAsyncpsVersion;
  context.commit = kAsyncpsCommit;
  std::vector<Finding> findings = std::move(first);
  for (Finding& f : Diagnose(probes, context)) findings.push_back(std::move(f));
  const bool problem = PrintFindings(findings) != 0;
  if (!problem) {
    int answered = 0, live = 0;
    std::string mode;
    for (const ShardProbe& p : probes) {
      if (!p.status.ok()) continue;
      ++answered;
      live = std::max(live, p.stats.live_workers());
      mode = p.stats.mode();
    }
    std::printf(
        "no problem found: %d of %zu shard process(es) answered (mode %s), "
        "%d worker(s) live\n",
        answered, probes.size(), mode.c_str(), live);
  }
  return problem ? 1 : 0;
}

}  // namespace asyncps
