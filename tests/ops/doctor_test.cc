// psctl doctor's diagnosis (tools/ops/psctl_doctor.h) from made-up
// answers: each cause it names, and silence on a healthy job.
// tests/python/doctor_test.py creates the causes with real processes.
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tools/ops/psctl_doctor.h"

namespace asyncps {
namespace {

const absl::Time kNow = absl::FromUnixSeconds(1800000000);

// A healthy shard's answer, asked at kNow, answered 2 ms later.
ShardProbe Healthy(int shard, int member = -1) {
  ShardProbe p;
  p.shard = shard;
  p.member = member;
  p.address = absl::StrCat("10.0.0.", shard + 1, ":500", member + 1);
  p.asked = kNow;
  p.answered = kNow + absl::Milliseconds(2);
  p.stats.set_mode("bsp");
  p.stats.set_start_timestamp_seconds(absl::ToUnixSeconds(kNow) - 100);
  p.stats.set_uptime_seconds(100);
  p.stats.set_version("0.5.0");
  p.stats.set_commit("abc");
  p.stats.set_num_bytes(1 << 20);
  p.stats.set_max_shard_bytes(uint64_t{4} << 30);
  p.stats.set_live_workers(2);
  return p;
}

DoctorContext Context() {
  DoctorContext c;
  c.version = "0.5.0";
  c.commit = "abc";
  return c;
}

// The one problem named, with every word of `words` in it.
void ExpectOneProblem(const std::vector<ShardProbe>& probes,
                      const std::vector<std::string>& words) {
  const std::vector<Finding> found = Diagnose(probes, Context());
  ASSERT_EQ(found.size(), 1u);
  EXPECT_TRUE(found[0].problem) << found[0].text;
  for (const std::string& w : words) {
    EXPECT_TRUE(absl::StrContains(found[0].text, w))
        << "'" << w << "' missing from: " << found[0].text;
  }
}

TEST(DoctorTest, AHealthyJobHasNothingToSay) {
  EXPECT_TRUE(Diagnose({Healthy(0), Healthy(1)}, Context()).empty());
}

TEST(DoctorTest, NamesAShardUnreachableOrRefusingTheToken) {
  ShardProbe down = Healthy(1);
  down.status = absl::UnavailableError("Connection refused");
  ExpectOneProblem({Healthy(0), down}, {"shard 1", "unreachable", "refused"});
  ShardProbe token = Healthy(1);
  token.status = absl::UnauthenticatedError("wrong token");
  ExpectOneProblem({Healthy(0), token}, {"shard 1", "--auth_token_file"});
  ShardProbe tls = Healthy(0);
  tls.status = absl::UnavailableError("Ssl handshake failed");
  ExpectOneProblem({tls}, {"TLS mismatch", "shard 0"});
  // Plaintext to a TLS shard is a closed socket, and the probe's
  // handshake tells it from a shard that is down.
  ShardProbe closed = Healthy(0);
  closed.status = absl::UnavailableError("Socket closed");
  closed.speaks_tls = true;
  ExpectOneProblem({closed}, {"TLS mismatch", "speaks TLS", "--tls_ca"});
}

TEST(DoctorTest, NamesAStallAndALostModel) {
  ShardProbe stalled = Healthy(0);
  stalled.stats.set_stall(
      "bsp pull of rank 0 at clock 7 held for 30s, waiting for rank 1");
  ExpectOneProblem({stalled}, {"waiting for rank 1", "30s"});
  ShardProbe lost = Healthy(0);
  lost.stats.set_awaiting_restore(true);
  ExpectOneProblem({lost}, {"waits for a worker's copy of its weights"});
}

TEST(DoctorTest, NamesDifferentBuilds) {
  ShardProbe other = Healthy(1);
  other.stats.set_commit("def");
  ExpectOneProblem({Healthy(0), other}, {"different builds", "abc", "def"});
  // psctl's own build apart: a note, not a problem.
  DoctorContext c = Context();
  c.commit = "fff";
  const std::vector<Finding> found = Diagnose({Healthy(0)}, c);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_FALSE(found[0].problem);
}

TEST(DoctorTest, NamesAClockApartFromThisHosts) {
  ShardProbe ahead = Healthy(0);
  ahead.stats.set_uptime_seconds(100 + 42);
  ExpectOneProblem({ahead}, {"42.0 s ahead of"});
  ShardProbe close = Healthy(0);
  close.stats.set_uptime_seconds(100 + 1.5);  // Within the bound.
  EXPECT_TRUE(Diagnose({close}, Context()).empty());
}

TEST(DoctorTest, NamesMemoryNearItsLimits) {
  ShardProbe full = Healthy(0);
  full.stats.set_num_bytes((uint64_t{4} << 30) / 100 * 95);  // 95 %.
  ExpectOneProblem({full}, {"--max_shard_bytes"});
  ShardProbe oom = Healthy(0);
  oom.stats.set_rss_bytes(uint64_t{15} << 30);
  oom.stats.set_memory_limit_bytes(uint64_t{16} << 30);
  ExpectOneProblem({oom}, {"OOM", "16.00 GiB"});
}

TEST(DoctorTest, NamesAWorkerPushingNaN) {
  ShardProbe a = Healthy(0), b = Healthy(1);
  for (ShardProbe* p : {&a, &b}) {
    v1::WorkerInfo* w = p->stats.add_workers();
    w->set_rank(3);
    w->set_nonfinite_pushes(2);
    w->set_seconds_since_nonfinite(p == &a ? 5 : 9);
  }
  ExpectOneProblem({a, b}, {"rank 3", "NaN", "4 time(s)", "5 s ago"});
  // Long ago: training went on since.
  a.stats.mutable_workers(0)->set_seconds_since_nonfinite(3600);
  b.stats.mutable_workers(0)->set_seconds_since_nonfinite(3600);
  EXPECT_TRUE(Diagnose({a, b}, Context()).empty());
}

TEST(DoctorTest, NamesAGroupWithoutAPrimaryOrBelowItsMinimum) {
  ShardProbe m0 = Healthy(0, 0), m1 = Healthy(0, 1);
  m0.stats.mutable_replica()->set_role("backup");
  m1.status = absl::UnavailableError("Connection refused");
  const std::vector<Finding> found = Diagnose({m0, m1}, Context());
  ASSERT_EQ(found.size(), 2u);  // The member down, and no primary.
  EXPECT_TRUE(absl::StrContains(found[1].text, "no primary")) << found[1].text;
  m0.stats.mutable_replica()->set_role("primary");
  m0.stats.mutable_replica()->set_in_sync(1);
  m0.stats.mutable_replica()->set_min_insync(2);
  m1.status = absl::OkStatus();
  m1.stats.mutable_replica()->set_role("joining");
  ExpectOneProblem({m0, m1}, {"below its --min_insync of 2", "joining"});
  m0.stats.mutable_replica()->set_in_sync(2);
  m1.stats.mutable_replica()->set_role("backup");
  m1.stats.mutable_replica()->set_coordinator_error("UNAVAILABLE: etcd grant");
  m1.stats.mutable_replica()->set_coordinator_failing_seconds(12);
  ExpectOneProblem({m0, m1},
                   {"member 1", "cannot reach etcd", "12 s", "etcd grant"});
}

}  // namespace
}  // namespace asyncps
