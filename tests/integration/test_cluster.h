// Test helper: a model spec for tests and a running set of ps_server shards.
#ifndef ASYNCPS_TESTS_INTEGRATION_TEST_CLUSTER_H_
#define ASYNCPS_TESTS_INTEGRATION_TEST_CLUSTER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cluster_spec.h"
#include "proto/asyncps.pb.h"
#include "tests/integration/subprocess.h"

namespace asyncps::testing {

// n ps_server processes on 127.0.0.1, shard i at servers()[i]. Killed when
// the object dies.
class TestCluster {
 public:
  static absl::StatusOr<std::unique_ptr<TestCluster>> Start(
      int num_shards, const std::vector<std::string>& extra_flags = {});
  // Each shard a group of `replicas` members (ps_server --replicas) on
  // fixed ports, coordinated by the etcd at `etcd`; returns once every
  // member serves (which is primary is the group's business).
  static absl::StatusOr<std::unique_ptr<TestCluster>> StartReplicated(
      int num_shards, int replicas, const std::string& etcd,
      const std::vector<std::string>& extra_flags = {});
  const std::vector<ServerAddress>& servers() const { return servers_; }
  // "127.0.0.1:p0,127.0.0.1:p1,...", a group's members joined by '|'.
  std::string ServerList() const;
  Subprocess& process(int shard) { return *procs_[shard * replicas_]; }
  // Member `m` of shard `shard` (replicated).
  Subprocess& member(int shard, int m) {
    return *procs_[shard * replicas_ + m];
  }
  // Its address.
  ServerAddress MemberAddress(int shard, int m) const {
    return servers_[shard].Members()[m];
  }
  // SIGKILLs member `m` of `shard` and starts it again on its port with its
  // flags: it joins its group as a backup.
  absl::Status RestartMember(int shard, int m);
  // SIGKILLs shard `shard` (if still running) and starts it again on the
  // same port with `flags` (replacing the flags it was started with).
  absl::Status Restart(int shard, const std::vector<std::string>& flags);

 private:
  int num_shards_ = 0;
  int replicas_ = 1;
  std::vector<std::vector<std::string>> flags_;  // Per process, replicated.
  std::vector<std::unique_ptr<Subprocess>> procs_;
  std::vector<ServerAddress> servers_;
};

// A spec of tensors with the given shapes, CONSTANT `init` everywhere, SGD.
v1::ModelSpec ConstantSpec(const std::vector<std::vector<int64_t>>& shapes,
                           int num_shards, float init, float lr,
                           uint64_t slice_bytes);

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_TEST_CLUSTER_H_
