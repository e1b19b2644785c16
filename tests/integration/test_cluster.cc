#include "tests/integration/test_cluster.h"

#include <signal.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace asyncps::testing {

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::Start(
    int num_shards, const std::vector<std::string>& extra_flags) {
  auto cluster = std::make_unique<TestCluster>();
  cluster->num_shards_ = num_shards;
  for (int s = 0; s < num_shards; ++s) {
    int port = 0;
    auto proc = StartServer(s, num_shards, &port, extra_flags);
    if (!proc.ok()) return proc.status();
    cluster->procs_.push_back(*std::move(proc));
    cluster->servers_.push_back(ServerAddress{"127.0.0.1", port});
  }
  return cluster;
}

absl::StatusOr<std::unique_ptr<TestCluster>> TestCluster::StartReplicated(
    int num_shards, int replicas, const std::string& etcd,
    const std::vector<std::string>& extra_flags) {
  auto cluster = std::make_unique<TestCluster>();
  cluster->num_shards_ = num_shards;
  cluster->replicas_ = replicas;
  for (int s = 0; s < num_shards; ++s) {
    ServerAddress group;
    for (int m = 0; m < replicas; ++m) {
      const int port = FreePort();
      std::vector<std::string> flags = extra_flags;
      flags.insert(flags.end(),
                   {absl::StrCat("--replicas=", replicas), "--etcd=" + etcd,
                    "--job=test", absl::StrCat("--port=", port),
                    absl::StrCat("--advertise=127.0.0.1:", port)});
      // The group's first member creates it; restarts never do.
      std::vector<std::string> first = flags;
      if (m == 0) first.push_back("--bootstrap");
      int listening = 0;
      auto proc = StartServer(s, num_shards, &listening, first);
      if (!proc.ok()) return proc.status();
      cluster->procs_.push_back(*std::move(proc));
      cluster->flags_.push_back(flags);
      ServerAddress a{"127.0.0.1", port, {}};
      if (m == 0) {
        group = a;
      } else {
        group.others.push_back(a);
      }
    }
    cluster->servers_.push_back(group);
  }
  return cluster;
}

absl::Status TestCluster::RestartMember(int shard, int m) {
  const size_t k = static_cast<size_t>(shard * replicas_ + m);
  procs_[k]->Signal(SIGKILL);
  if (procs_[k]->Wait(absl::Seconds(30)) == -1) {
    return absl::DeadlineExceededError("killed member did not exit");
  }
  int port = 0;
  auto proc = StartServer(shard, num_shards_, &port, flags_[k]);
  if (!proc.ok()) return proc.status();
  procs_[k] = *std::move(proc);
  return absl::OkStatus();
}

absl::Status TestCluster::Restart(int shard,
                                  const std::vector<std::string>& flags) {
  procs_[shard]->Signal(SIGKILL);
  if (procs_[shard]->Wait(absl::Seconds(30)) == -1) {
    return absl::DeadlineExceededError("killed shard did not exit");
  }
  std::vector<std::string> with_port = flags;
  with_port.push_back(absl::StrCat("--port=", servers_[shard].port));
  int port = 0;
  auto proc = StartServer(shard, num_shards_, &port, with_port);
  if (!proc.ok()) return proc.status();
  procs_[shard] = *std::move(proc);
  return absl::OkStatus();
}

std::string TestCluster::ServerList() const {
  return absl::StrJoin(
      servers_, ",", [](std::string* out, const ServerAddress& a) {
        out->append(absl::StrJoin(a.Members(), "|",
                                  [](std::string* o, const ServerAddress& m) {
                                    o->append(m.ToString());
                                  }));
      });
}

v1::ModelSpec ConstantSpec(const std::vector<std::vector<int64_t>>& shapes,
                           int num_shards, float init, float lr,
                           uint64_t slice_bytes) {
  v1::ModelSpec spec;
  spec.set_name("test");
  spec.set_seed(1);
  spec.set_slice_bytes(slice_bytes);
  spec.set_num_shards(num_shards);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(lr);
  int i = 0;
  for (const auto& shape : shapes) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(absl::StrCat("t", i++));
    t->set_dtype(v1::DTYPE_F32);
    for (int64_t d : shape) t->add_shape(d);
    t->mutable_init()->set_kind(v1::Initializer::CONSTANT);
    t->mutable_init()->set_value(init);
  }
  return spec;
}

}  // namespace asyncps::testing
