// psctl status's worker rows: steps a second between two refreshes, on
// shard 0's clock, and each worker's lag behind the furthest.
#include "gtest/gtest.h"
#include "tools/ops/psctl_status.h"

namespace asyncps {
namespace {

v1::StatsResponse Shard(uint64_t incarnation, double uptime,
                        std::vector<std::pair<int, int64_t>> clocks) {
  v1::StatsResponse s;
  s.set_incarnation(incarnation);
  s.set_uptime_seconds(uptime);
  for (const auto& [rank, clock] : clocks) {
    v1::WorkerInfo* w = s.add_workers();
    w->set_rank(rank);
    w->set_clock(clock);
    w->set_live(true);
  }
  return s;
}

TEST(StatusTest, StepsASecondAndLagBetweenRefreshes) {
  const std::vector<v1::StatsResponse> before = {
      Shard(7, 10.0, {{0, 100}, {1, 90}})};
  const std::vector<v1::StatsResponse> now = {
      Shard(7, 12.0, {{0, 140}, {1, 100}, {2, 5}})};
  const std::vector<WorkerRow> rows = WorkerRows(now, before);
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_DOUBLE_EQ(rows[0].steps_per_second, 20.0);  // 40 steps in 2 s.
  EXPECT_DOUBLE_EQ(rows[1].steps_per_second, 5.0);
  EXPECT_EQ(rows[2].steps_per_second, -1);  // Not there before.
  EXPECT_EQ(rows[0].lag, 0);
  EXPECT_EQ(rows[1].lag, 40);
  EXPECT_EQ(rows[2].lag, 135);
}

TEST(StatusTest, NoRateOnTheFirstRefreshOrAcrossARestart) {
  const std::vector<v1::StatsResponse> now = {Shard(7, 12.0, {{0, 140}})};
  EXPECT_EQ(WorkerRows(now, {})[0].steps_per_second, -1);
  const std::vector<v1::StatsResponse> other = {Shard(8, 1.0, {{0, 100}})};
  EXPECT_EQ(WorkerRows(now, other)[0].steps_per_second, -1);
}

TEST(StatusTest, TheFreshestShardsReportWins) {
  v1::StatsResponse a = Shard(7, 12.0, {{0, 10}});
  a.mutable_workers(0)->set_seconds_since_heard(5);
  v1::StatsResponse b = Shard(9, 12.0, {{0, 30}});
  b.mutable_workers(0)->set_seconds_since_heard(1);
  EXPECT_EQ(WorkerRows({a, b}, {})[0].info.clock(), 30);
}

}  // namespace
}  // namespace asyncps
