// psctl doctor (issue #44): asks every shard, and every member of a
// replicated group, for its Stats at once, and names in plain words what
// keeps the job from training: a shard unreachable or not serving, a token
// or TLS mismatch, builds that differ, a bsp or ssp pull waiting on a rank
// (and since when), a group without a primary or below its minimum in
// sync, a clock apart from this host's, a shard near its memory limit, a
// worker pushing NaN. Diagnose is pure (tested with made-up answers);
// DoctorCommand asks the shards and prints.
#ifndef ASYNCPS_TOOLS_OPS_PSCTL_DOCTOR_H_
#define ASYNCPS_TOOLS_OPS_PSCTL_DOCTOR_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "client/admin_client.h"
#include "common/cluster_spec.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

// One shard's (or group member's) answer to Stats.
struct ShardProbe {
  int shard = 0;
  int member = -1;  // Its index in the group; -1: not replicated.
  std::string address;
  absl::Status status;         // Of the call.
  v1::StatsResponse stats;     // When status is OK.
  absl::Time asked, answered;  // This host's clock around the call.
  // A shard that did not answer psctl's plaintext call but completes a
  // TLS handshake: it runs TLS and psctl was given no --tls_ca.
  bool speaks_tls = false;
};

// What the doctor says: a problem (something keeps the job from training,
// or soon will) or a note (worth knowing, not wrong by itself).
struct Finding {
  bool problem = false;
  std::string text;
};

// What the doctor compares the shards with.
struct DoctorContext {
  std::string version;  // psctl's own build.
  std::string commit;
  // A shard's clock further from this host's than this (beyond the call's
  // round trip) is named.
  absl::Duration clock_skew = absl::Seconds(2);
  // Memory held past this share of its limit is named.
  double memory_share = 0.9;
  // A worker's NaN or Inf pushes are named while the last is this recent.
  absl::Duration nonfinite_window = absl::Minutes(10);
};

std::vector<Finding> Diagnose(const std::vector<ShardProbe>& probes,
                              const DoctorContext& context);

// Asks every shard of `servers` (each member of a group) for its Stats, all
// at once (each call bounded by `admin`'s caller's timeouts). Without TLS
// of its own (`tls` false), tries a TLS handshake with each shard that did
// not answer (a TLS server closes a plaintext connection without a word).
std::vector<ShardProbe> ProbeShards(AdminClient* admin,
                                    const std::vector<ServerAddress>& servers,
                                    bool tls);

// Whether host:port completes the server's half of a TLS handshake before
// `deadline` (its certificate is not checked: only that it speaks TLS).
bool SpeaksTls(const ServerAddress& address, absl::Time deadline);

// psctl doctor: prints `first` (what etcd said, psctl doctor --etcd) and
// each finding ("PROBLEM: ..." or "note: ..."), or that none was found; 1
// if there is a problem, else 0.
int DoctorCommand(AdminClient* admin, const std::vector<ServerAddress>& servers,
                  bool tls, std::vector<Finding> first = {});

// Prints `findings` as DoctorCommand does; 1 if one is a problem, else 0.
int PrintFindings(const std::vector<Finding>& findings);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_PSCTL_DOCTOR_H_
