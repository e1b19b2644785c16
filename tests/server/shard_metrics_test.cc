// StatsToMetrics against golden text: every metric's name, labels, HELP,
// TYPE and value, in order, as the Prometheus text format writes them.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "proto/asyncps.pb.h"
#include "server/edge/metrics.h"

namespace asyncps {
namespace {

std::string Golden(const std::string& name) {
  const std::string path = std::string(std::getenv("TEST_SRCDIR")) + "/" +
                           std::getenv("TEST_WORKSPACE") +
                           "/tests/server/testdata/" + name;
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Writes what the code gives to the test's outputs, to regenerate a golden.
std::string Text(const v1::StatsResponse& s, const std::string& name) {
  const std::string text =
      prometheus::TextSerializer().Serialize(StatsToMetrics(s));
  if (const char* dir = std::getenv("TEST_UNDECLARED_OUTPUTS_DIR")) {
    std::ofstream(std::string(dir) + "/" + name) << text;
  }
  return text;
}

// Two workers, every field of each set.
void AddWorkers(v1::StatsResponse* s) {
  for (int rank = 0; rank < 2; ++rank) {
    v1::WorkerInfo* w = s->add_workers();
    w->set_rank(rank);
    w->set_incarnation(100 + rank);
    w->set_clock(110 + rank);
    w->set_seconds_since_heard(0.5 + rank);
    w->set_live(rank == 0);
    w->set_host("host" + std::to_string(rank));
    w->set_last_seen_timestamp_seconds(1.7e9 + rank);
    w->set_finished(rank == 1);
    v1::WorkerProgress* p = w->mutable_progress();
    p->set_samples(1000 + rank);
    p->set_samples_per_second(12.5 + rank);
    p->set_loss(0.25 + rank);
    p->set_data_seconds(1.5 + rank);
    p->set_compute_seconds(2.5 + rank);
    p->set_exchange_seconds(3.5 + rank);
  }
}

// Two embedding tables, every field of each set.
void AddEmbeddings(v1::StatsResponse* s) {
  for (int t = 0; t < 2; ++t) {
    v1::EmbeddingStats* e = s->add_embeddings();
    e->set_name("table" + std::to_string(t));
    e->set_dim(8);
    e->set_rows(300 + t);
    e->set_evicted(400 + t);
    e->set_rows_pulled(500 + t);
    e->set_rows_pushed(600 + t);
    e->set_bytes_received(700 + t);
    e->set_bytes_sent(800 + t);
    e->set_duplicate_pushes(900 + t);
    e->set_expired(1000 + t);
    e->set_not_admitted(1100 + t);
  }
}

// A primary with two backups, every field set.
void SetReplica(v1::ReplicaStats* r) {
  r->set_role("primary");
  r->set_epoch(41);
  r->set_member("a:1");
  r->set_primary("a:1");
  r->add_backups("b:1");
  r->add_backups("c:1");
  r->set_applied_seq(46);
  r->set_lag(47);
  r->set_replicated_bytes(48);
  r->set_failovers(49);
  r->set_in_sync(3);
  r->set_min_insync(2);
  r->set_below_min_insync(50);
}

// Every field set, each to its own value.
v1::StatsResponse Full() {
  v1::StatsResponse s;
  s.set_shard(1);
  s.set_num_shards(3);
  s.set_model_declared(true);
  s.set_model_name("mlp");
  s.set_num_slices(5);
  s.set_num_bytes(6006);
  s.set_updates_applied(7);
  s.set_pushes(8);
  s.set_pulls(9);
  s.set_rejected_requests(10);
  for (int k = 0; k < 4; ++k) s.add_staleness_histogram(11 + k);
  AddWorkers(&s);
  s.set_uptime_seconds(13.5);
  s.set_mode("ssp");
  s.set_dropped_stale(15);
  s.set_dropped_late(16);
  s.set_steps_applied(17);
  s.set_steps_short(18);
  s.set_held_pulls(19);
  s.set_live_workers(20);
  s.set_max_clock_gap(21);
  s.set_incarnation(0xabc22);
  s.set_dropped_restarted(23);
  s.set_duplicate_pushes(24);
  s.set_awaiting_restore(true);
  s.set_min_version(26);
  s.set_max_version(27);
  s.set_stall("rank 1");
  s.set_checkpoints_written(29);
  s.set_checkpoints_failed(30);
  s.set_checkpoint_age_seconds(31.5);
  s.set_checkpoint_write_seconds(32.5);
  s.set_checkpoint_bytes(33);
  s.set_oldest_held_pull_seconds(34.5);
  s.set_start_timestamp_seconds(1.6e9);
  s.set_last_checkpoint_timestamp_seconds(1.65e9);
  s.set_staleness_bound(37);
  s.set_job_done(true);
  AddEmbeddings(&s);
  SetReplica(s.mutable_replica());
  s.set_compensated(41);
  s.set_uncompensated(42);
  return s;
}

TEST(ShardMetrics, FullStatsMatchGolden) {
  EXPECT_EQ(Text(Full(), "full.txt"), Golden("shard_metrics_full.txt"));
}

TEST(ShardMetrics, EmptyStatsMatchGolden) {
  EXPECT_EQ(Text(v1::StatsResponse(), "empty.txt"),
            Golden("shard_metrics_empty.txt"));
}

TEST(ShardMetrics, BackupReportsNoBackups) {
  v1::StatsResponse s = Full();
  s.mutable_replica()->set_role("backup");
  const std::string text = Text(s, "backup.txt");
  EXPECT_NE(text.find("asyncps_replica_backups 0"), std::string::npos) << text;
  EXPECT_NE(text.find("asyncps_replica_role{role=\"backup\"} 1"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace asyncps
