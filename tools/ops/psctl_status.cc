#include "tools/ops/psctl_status.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace asyncps {
namespace {

// Seconds between two answers of one shard on its own clock (its uptime),
// or 0 unless both come from the same process and time moved on.
double SecondsBetween(const v1::StatsResponse& now,
                      const v1::StatsResponse& before) {
  if (now.incarnation() != before.incarnation()) return 0;
  return std::max(0.0, now.uptime_seconds() - before.uptime_seconds());
}

// One line a shard: its model, its size and its updates a second (since
// `previous`, the last refresh, if it is the same incarnation; else since
// the shard started).
void PrintShards(const std::vector<v1::StatsResponse>& stats,
                 const std::vector<v1::StatsResponse>& previous) {
  std::printf("%-5s %-16s %7s %9s %15s %11s %5s %9s %10s\n", "shard",
              "incarnation", "slices", "MiB", "versions", "updates/s", "live",
              "uptime", "checkpoint");
  for (size_t s = 0; s < stats.size(); ++s) {
    const v1::StatsResponse& r = stats[s];
    double rate =
        r.uptime_seconds() > 0 ? r.updates_applied() / r.uptime_seconds() : 0.0;
    if (const double seconds =
            s < previous.size() ? SecondsBetween(r, previous[s]) : 0;
        seconds > 0) {
      rate = (r.updates_applied() - previous[s].updates_applied()) / seconds;
    }
    const std::string checkpoint =
        r.checkpoint_age_seconds() < 0
            ? "none"
            : absl::StrFormat("%.0fs ago", r.checkpoint_age_seconds());
    std::printf(
        "%-5u %016llx %7u %9.2f %7lld..%-7lld %11.1f %5d %8.0fs %10s%s\n",
        r.shard(), static_cast<unsigned long long>(r.incarnation()),
        r.num_slices(), r.num_bytes() / 1048576.0,
        static_cast<long long>(r.min_version()),
        static_cast<long long>(r.max_version()), rate, r.live_workers(),
        r.uptime_seconds(), checkpoint.c_str(),
        r.awaiting_restore() ? "  awaiting a worker's copy" : "");
    if (!r.stall().empty()) {
      std::printf("      stalled: %s\n", r.stall().c_str());
    }
  }
}

// Each rank's freshest report over the shards.
std::map<int, v1::WorkerInfo> Freshest(
    const std::vector<v1::StatsResponse>& stats) {
  std::map<int, v1::WorkerInfo> workers;
  for (const auto& r : stats) {
    for (const auto& w : r.workers()) {
      auto it = workers.find(w.rank());
      if (it == workers.end() ||
          w.seconds_since_heard() < it->second.seconds_since_heard()) {
        workers[w.rank()] = w;
      }
    }
  }
  return workers;
}

// One line a worker.
void PrintWorkerTable(const std::vector<v1::StatsResponse>& stats,
                      const std::vector<v1::StatsResponse>& previous) {
  std::printf("%-5s %-20s %9s %7s %6s %9s %5s %10s %10s %8s %22s\n", "rank",
              "host", "clock", "steps/s", "lag", "staleness", "live",
              "last seen", "samples/s", "loss", "data/compute/exchange");
  for (const WorkerRow& row : WorkerRows(stats, previous)) {
    const v1::WorkerInfo& w = row.info;
    const v1::WorkerProgress& p = w.progress();
    const double total =
        p.data_seconds() + p.compute_seconds() + p.exchange_seconds();
    auto share = [total](double s) { return total > 0 ? 100 * s / total : 0; };
    const std::string rate =
        row.steps_per_second < 0
            ? "-"
            : absl::StrFormat("%.1f", row.steps_per_second);
    std::printf(
        "%-5d %-20s %9lld %7s %6lld %9.2f %5s %9.1fs %10.0f %8.4f "
        "%6.0f%%/%3.0f%%/%3.0f%%\n",
        w.rank(), w.host().c_str(), static_cast<long long>(w.clock()),
        rate.c_str(), static_cast<long long>(row.lag), p.staleness(),
        w.live() ? "yes" : "NO", w.seconds_since_heard(),
        p.samples_per_second(), p.loss(), share(p.data_seconds()),
        share(p.compute_seconds()), share(p.exchange_seconds()));
  }
}

// One line an embedding table, summed over the shards (each holds the ids
// RowShard gives it); nothing if there is none.
void PrintEmbeddingTotals(const std::vector<v1::StatsResponse>& stats) {
  std::map<std::string, v1::EmbeddingStats> tables;
  for (const auto& r : stats) {
    for (const auto& e : r.embeddings()) {
      v1::EmbeddingStats& t = tables[e.name()];
      t.set_dim(e.dim());
      t.set_rows(t.rows() + e.rows());
      t.set_evicted(t.evicted() + e.evicted());
      t.set_expired(t.expired() + e.expired());
      t.set_not_admitted(t.not_admitted() + e.not_admitted());
      t.set_rows_pulled(t.rows_pulled() + e.rows_pulled());
      t.set_rows_pushed(t.rows_pushed() + e.rows_pushed());
      t.set_bytes_received(t.bytes_received() + e.bytes_received());
      t.set_bytes_sent(t.bytes_sent() + e.bytes_sent());
    }
  }
  if (tables.empty()) return;
  std::printf("%-20s %6s %12s %12s %10s %12s %14s %14s %10s %10s\n",
              "embedding", "dim", "rows", "evicted", "expired", "not admitted",
              "rows pulled", "rows pushed", "MB in", "MB out");
  for (const auto& [name, t] : tables) {
    std::printf(
        "%-20s %6lld %12lld %12lld %10lld %12lld %14lld %14lld %10.1f "
        "%10.1f\n",
        name.c_str(), static_cast<long long>(t.dim()),
        static_cast<long long>(t.rows()), static_cast<long long>(t.evicted()),
        static_cast<long long>(t.expired()),
        static_cast<long long>(t.not_admitted()),
        static_cast<long long>(t.rows_pulled()),
        static_cast<long long>(t.rows_pushed()), t.bytes_received() / 1e6,
        t.bytes_sent() / 1e6);
  }
}

}  // namespace

std::vector<WorkerRow> WorkerRows(
    const std::vector<v1::StatsResponse>& stats,
    const std::vector<v1::StatsResponse>& previous) {
  const std::map<int, v1::WorkerInfo> now = Freshest(stats);
  const std::map<int, v1::WorkerInfo> before = Freshest(previous);
  // The time between the refreshes, on shard 0's clock.
  const double elapsed = stats.empty() || previous.empty()
                             ? 0
                             : SecondsBetween(stats[0], previous[0]);
  int64_t furthest = 0;
  for (const auto& [rank, w] : now) furthest = std::max(furthest, w.clock());
  std::vector<WorkerRow> rows;
  for (const auto& [rank, w] : now) {
    WorkerRow row;
    row.info = w;
    row.lag = furthest - w.clock();
    auto it = before.find(rank);
    if (elapsed > 0 && it != before.end() && w.clock() >= it->second.clock()) {
      row.steps_per_second = (w.clock() - it->second.clock()) / elapsed;
    }
    rows.push_back(std::move(row));
  }
  return rows;
}

void PrintStatus(const std::vector<v1::StatsResponse>& stats,
                 const std::vector<v1::StatsResponse>& previous) {
  if (stats.empty()) return;
  std::printf("asyncps: %zu shards, mode %s, model '%s'\n", stats.size(),
              stats[0].mode().c_str(), stats[0].model_name().c_str());
  PrintShards(stats, previous);
  PrintWorkerTable(stats, previous);
  PrintEmbeddingTotals(stats);
}

void PrintGroups(AdminClient* admin, ShardCaller* caller) {
  bool replicated = false;
  for (int s = 0; s < caller->num_shards(); ++s) {
    replicated |= caller->num_members(s) > 1;
  }
  if (!replicated) return;
  // in_sync: a primary's members holding every acknowledged change over
  // its --min_insync ("!" below it: changes are refused).
  std::printf("%-5s %-22s %-8s %6s %9s %8s %12s  %s\n", "shard", "member",
              "role", "epoch", "applied", "in_sync", "replicated", "backups");
  for (int s = 0; s < caller->num_shards(); ++s) {
    for (int m = 0; m < caller->num_members(s); ++m) {
      const std::string address = caller->member_address(s, m).ToString();
      auto stats = admin->MemberStats(s, m);
      if (!stats.ok()) {
        std::printf("%-5d %-22s %-8s %s\n", s, address.c_str(), "DOWN",
                    std::string(stats.status().message()).c_str());
        continue;
      }
      const v1::ReplicaStats& r = stats->replica();
      const std::string in_sync =
          r.role() != "primary"
              ? "-"
              : absl::StrCat(r.in_sync(), "/", r.min_insync(),
                             r.in_sync() < r.min_insync() ? "!" : "");
      std::printf(
          "%-5d %-22s %-8s %6lld %9llu %8s %11.1fM  %s\n", s, address.c_str(),
          r.role().c_str(), static_cast<long long>(r.epoch()),
          static_cast<unsigned long long>(r.applied_seq()), in_sync.c_str(),
          r.replicated_bytes() / 1e6, absl::StrJoin(r.backups(), ",").c_str());
    }
  }
}

void PrintHistogram(const std::vector<v1::StatsResponse>& stats) {
  std::vector<int64_t> sum;
  for (const auto& s : stats) {
    if (sum.size() < static_cast<size_t>(s.staleness_histogram_size())) {
      sum.resize(s.staleness_histogram_size(), 0);
    }
    for (int k = 0; k < s.staleness_histogram_size(); ++k) {
      sum[k] += s.staleness_histogram(k);
    }
  }
  std::printf("staleness,count\n");
  for (size_t k = 0; k < sum.size(); ++k) {
    std::printf("%zu,%lld\n", k, static_cast<long long>(sum[k]));
  }
}

void PrintWorkers(const std::vector<v1::StatsResponse>& stats) {
  std::printf("shard,rank,clock,live,seconds_since_heard\n");
  for (const auto& s : stats) {
    for (const auto& w : s.workers()) {
      std::printf("%u,%d,%lld,%d,%.3f\n", s.shard(), w.rank(),
                  static_cast<long long>(w.clock()), w.live() ? 1 : 0,
                  w.seconds_since_heard());
    }
  }
}

}  // namespace asyncps
