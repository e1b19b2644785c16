// psctl doctor --etcd (issue #44): a replicated job read from its group
// records, each fault of the records named, over the in-memory coordinator
// (the real etcd and psctl: //tests/integration:doctor_etcd_test).
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "server/replica/testing/memory_coordinator.h"
#include "tools/ops/psctl_doctor_etcd.h"

namespace asyncps {
namespace {

constexpr char kJob[] = "/asyncps/j";

class DoctorEtcdTest : public ::testing::Test {
 protected:
  void Put(int shard, const std::string& name, const std::string& value) {
    ASSERT_TRUE(
        view_.Put(absl::StrCat(kJob, "/shard/", shard, "/", name), value, 0)
            .ok());
  }
  // A group as a running one has it: records, a primary, a backup.
  void Healthy(int shard, int port) {
    Put(shard, "incarnation", "7");
    Put(shard, "insync", "1:");
    Put(shard, "primary", absl::StrCat("127.0.0.1:", port));
    Put(shard, absl::StrCat("members/127.0.0.1:", port), "primary");
    Put(shard, absl::StrCat("members/127.0.0.1:", port + 1), "backup");
  }
  EtcdJob Read() { return ReadEtcdJob(&view_, "etcd:2379", kJob); }

  MemoryCoordinator store_;
  MemoryCoordinator::View view_{&store_};
};

// Whether the findings are exactly one problem, saying each of `words`.
void ExpectOneProblem(const EtcdJob& job,
                      const std::vector<std::string>& words) {
  ASSERT_EQ(job.findings.size(), 1u);
  EXPECT_TRUE(job.findings[0].problem);
  for (const std::string& w : words) {
    EXPECT_TRUE(absl::StrContains(job.findings[0].text, w))
        << "'" << w << "' not in: " << job.findings[0].text;
  }
}

TEST_F(DoctorEtcdTest, AHealthyJobGivesItsMembersPrimaryFirst) {
  Healthy(0, 5000);
  Healthy(1, 6001);  // Then a failover: the primary is its second member.
  Put(1, "primary", "127.0.0.1:6002");
  const EtcdJob job = Read();
  EXPECT_TRUE(job.findings.empty());
  ASSERT_EQ(job.servers.size(), 2u);
  EXPECT_EQ(job.servers[0].ToString(), "127.0.0.1:5000");
  ASSERT_EQ(job.servers[0].others.size(), 1u);
  EXPECT_EQ(job.servers[0].others[0].ToString(), "127.0.0.1:5001");
  EXPECT_EQ(job.servers[1].ToString(), "127.0.0.1:6002");
  EXPECT_EQ(job.servers[1].others[0].ToString(), "127.0.0.1:6001");
}

TEST_F(DoctorEtcdTest, EtcdOutOfReachIsNamedAndNothingElse) {
  Healthy(0, 5000);
  view_.set_cut(true);
  const EtcdJob job = Read();
  ExpectOneProblem(job, {"etcd at etcd:2379 is unreachable", "leases"});
  EXPECT_TRUE(job.servers.empty());
}

TEST_F(DoctorEtcdTest, AJobWithNoGroupsIsNamed) {
  Healthy(0, 5000);
  const EtcdJob other = ReadEtcdJob(&view_, "etcd:2379", "/asyncps/other");
  ExpectOneProblem(other, {"no group of this job", "/asyncps/other/shard/",
                           "psctl group init"});
  EXPECT_TRUE(other.servers.empty());
}

TEST_F(DoctorEtcdTest, AGroupWithoutRecordsOrPrimaryOrMembersIsNamed) {
  Healthy(0, 5000);
  Put(1, "members/127.0.0.1:6000", "backup");  // No records, no primary.
  Healthy(3, 7000);
  ASSERT_TRUE(
      view_.DeleteIf({}, {absl::StrCat(kJob, "/shard/3/primary")}).ok());
  Put(4, "incarnation", "9");  // Records, and nobody holds a lease.
  Put(4, "insync", "2:");
  const EtcdJob job = Read();
  std::vector<std::string> said;
  for (const Finding& f : job.findings) {
    EXPECT_TRUE(f.problem) << f.text;
    said.push_back(f.text);
  }
  ASSERT_EQ(said.size(), 5u) << absl::StrJoin(said, "\n");
  EXPECT_TRUE(absl::StrContains(said[0],
                                "shard 1's group has no "
                                "incarnation nor insync record"))
      << said[0];
  EXPECT_TRUE(absl::StrContains(said[1], "shard 1 has no primary")) << said[1];
  EXPECT_TRUE(absl::StrContains(said[2], "shard 2 has nothing in etcd"))
      << said[2];
  EXPECT_TRUE(absl::StrContains(said[3], "shard 3 has no primary")) << said[3];
  EXPECT_TRUE(absl::StrContains(said[4], "shard 4: no member holds a lease"))
      << said[4];
  EXPECT_TRUE(job.servers.empty());  // Shards 2 and 4 have none to ask.
}

}  // namespace
}  // namespace asyncps
