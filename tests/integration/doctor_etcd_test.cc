// psctl doctor --etcd=H:P --job=NAME against a real etcd and a real
// replicated job (issue #44): the job is found in etcd and probed (no
// problem in a healthy one); a job etcd holds nothing of is named; etcd
// gone is named within the doctor's 10 s. The records' other faults are
// made up in //tests/ops:doctor_etcd_test.
#include <sys/wait.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/integration/etcd_process.h"
#include "tests/integration/subprocess.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

// Runs psctl doctor with `flags`; its exit code, and its output in `*out`.
int Doctor(const std::vector<std::string>& flags, std::string* out) {
  std::vector<std::string> argv = {RunfilePath("tools/psctl")};
  argv.insert(argv.end(), flags.begin(), flags.end());
  argv.push_back("doctor");
  auto psctl = Subprocess::Start(argv);
  EXPECT_TRUE(psctl.ok()) << psctl.status();
  if (!psctl.ok()) return -1;
  const int status = (*psctl)->Wait(absl::Seconds(30));
  *out = (*psctl)->output();
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(DoctorEtcd, FindsTheJobInEtcdAndNamesWhatIsWrongThere) {
  auto etcd = StartEtcd("doctor");
  ASSERT_TRUE(etcd.ok()) << etcd.status();
  auto cluster = TestCluster::StartReplicated(1, 2, etcd->endpoint);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  const std::string at = "--etcd=" + etcd->endpoint;
  std::string out;

  // A healthy job (TestCluster's is "test"): both members found and asked.
  // Right after the start a member may still be joining; the doctor is
  // asked until it says nothing is wrong (bounded).
  int code = -1;
  for (int i = 0; i < 20 && code != 0; ++i) {
    code = Doctor({at, "--job=test"}, &out);
    if (code != 0) absl::SleepFor(absl::Milliseconds(500));
  }
  EXPECT_EQ(code, 0) << out;
  EXPECT_TRUE(absl::StrContains(
      out, "no problem found: 2 of 2 shard process(es) answered"))
      << out;

  EXPECT_EQ(Doctor({at, "--job=nosuch"}, &out), 1) << out;
  EXPECT_TRUE(absl::StrContains(out, "holds no group of this job")) << out;

  etcd->process->Signal(SIGKILL);
  etcd->process->Wait(absl::Seconds(10));
  const absl::Time start = absl::Now();
  EXPECT_EQ(Doctor({at, "--job=test"}, &out), 1) << out;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(absl::StrContains(
      out, "PROBLEM: etcd at " + etcd->endpoint + " is unreachable"))
      << out;
}

}  // namespace
}  // namespace asyncps::testing
