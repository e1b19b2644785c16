#include "server/edge/shard_stats.h"

#include "common/build_info.h"
#include "common/process_metrics.h"

namespace asyncps {
namespace {

using S = v1::StatsResponse;
using K = ShardCounter;
constexpr StatKind kCounter = StatKind::kCounter;
constexpr StatKind kGauge = StatKind::kGauge;

// A counter's row; `reason`: a sample of
// asyncps_shard_dropped_gradients_total.
constexpr StatRow Counted(StatSection section, const char* name,
                          const char* help, ShardCounter counter,
                          void (S::*set)(int64_t), int64_t (S::*get)() const,
                          const char* reason = nullptr) {
  StatRow row{section, name, help, kCounter};
  if (reason != nullptr) {
    row.label_name = "reason";
    row.label_value = reason;
  }
  row.counter = counter;
  row.set = set;
  row.get = get;
  return row;
}

// A row read from the rest of the answer.
constexpr StatRow Read(StatSection section, const char* name, const char* help,
                       StatKind kind, double (*read)(const S&)) {
  StatRow row{section, name, help, kind};
  row.read = read;
  return row;
}

constexpr StatSection kCalls = StatSection::kCalls;
constexpr StatSection kWorkers = StatSection::kWorkers;
constexpr StatSection kShard = StatSection::kShard;
constexpr StatSection kReplica = StatSection::kReplica;
constexpr StatSection kSsp = StatSection::kSsp;
constexpr char kDropped[] = "asyncps_shard_dropped_gradients_total";
constexpr char kDroppedHelp[] = "Slice gradients not applied, by reason.";

constexpr StatRow kRows[] = {
    Counted(kCalls, "asyncps_shard_pushes_total", "Push calls accepted.",
            K::kPushes, &S::set_pushes, &S::pushes),
    Counted(kCalls, "asyncps_shard_pulls_total", "Pull calls answered.",
            K::kPulls, &S::set_pulls, &S::pulls),
    Counted(kCalls, "asyncps_shard_rejected_requests_total",
            "Calls refused by validation.", K::kRejected,
            &S::set_rejected_requests, &S::rejected_requests),
    Counted(kCalls, "asyncps_shard_updates_applied_total",
            "Slice updates applied (optimizer steps on one slice).",
            K::kUpdatesApplied, &S::set_updates_applied, &S::updates_applied),
    Counted(kCalls, "asyncps_shard_duplicate_pushes_total",
            "Retried pushes answered from the ledger, not applied again.",
            K::kDuplicatePushes, &S::set_duplicate_pushes,
            &S::duplicate_pushes),
    Counted(kCalls, "asyncps_shard_bsp_steps_applied_total",
            "bsp: slice steps applied.", K::kStepsApplied,
            &S::set_steps_applied, &S::steps_applied),
    Counted(kCalls, "asyncps_shard_bsp_steps_short_total",
            "bsp: slice steps applied with fewer gradients than live workers.",
            K::kStepsShort, &S::set_steps_short, &S::steps_short),
    Read(kCalls, "asyncps_shard_held_pulls_total",
         "ssp/bsp: pulls that had to wait.", kCounter,
         [](const S& s) -> double { return s.held_pulls(); }),
    Counted(kCalls, kDropped, kDroppedHelp, K::kDroppedStale,
            &S::set_dropped_stale, &S::dropped_stale, "stale"),
    Counted(kCalls, kDropped, kDroppedHelp, K::kDroppedLate,
            &S::set_dropped_late, &S::dropped_late, "late"),
    Counted(kCalls, kDropped, kDroppedHelp, K::kDroppedRestarted,
            &S::set_dropped_restarted, &S::dropped_restarted, "restarted"),
    Counted(kCalls, "asyncps_shard_compensated_total",
            "--stale_policy=dc: stale slice gradients compensated for their "
            "delay.",
            K::kCompensated, &S::set_compensated, &S::compensated),
    Counted(kCalls, "asyncps_shard_uncompensated_total",
            "--stale_policy=dc: stale slice gradients applied as they were "
            "(their version older than the window).",
            K::kUncompensated, &S::set_uncompensated, &S::uncompensated),
    Read(kWorkers, "asyncps_shard_live_workers", "Workers heard from lately.",
         kGauge, [](const S& s) -> double { return s.live_workers(); }),
    Read(kWorkers, "asyncps_shard_registered_workers",
         "Ranks that have registered since the shard started.", kGauge,
         [](const S& s) -> double { return s.workers_size(); }),
    Read(kShard, "asyncps_shard_max_clock_gap",
         "Largest gap seen between two live workers' clocks.", kGauge,
         [](const S& s) -> double { return s.max_clock_gap(); }),
    Read(kShard, "asyncps_shard_slices", "Slices this shard holds.", kGauge,
         [](const S& s) -> double { return s.num_slices(); }),
    Read(kShard, "asyncps_shard_weight_bytes", "Weight bytes this shard holds.",
         kGauge, [](const S& s) -> double { return s.num_bytes(); }),
    Read(kShard, "asyncps_shard_slice_version_min",
         "Lowest slice version (bsp: step applied).", kGauge,
         [](const S& s) -> double { return s.min_version(); }),
    Read(kShard, "asyncps_shard_slice_version_max",
         "Highest slice version (bsp: step applied).", kGauge,
         [](const S& s) -> double { return s.max_version(); }),
    Read(kShard, "asyncps_shard_awaiting_restore",
         "1 while the shard waits for a worker's copy of a lost model.", kGauge,
         [](const S& s) -> double { return s.awaiting_restore() ? 1 : 0; }),
    Read(kShard, "asyncps_shard_oldest_held_pull_seconds",
         "ssp/bsp: how long the longest-held pull has waited (0: none held).",
         kGauge, [](const S& s) { return s.oldest_held_pull_seconds(); }),
    Read(kShard, "asyncps_shard_stalled",
         "1 while a held pull has waited past --stall_warn (psctl status says "
         "for whom).",
         kGauge,
         [](const S& s) -> double { return s.stall().empty() ? 0 : 1; }),
    Read(kShard, "asyncps_shard_checkpoints_written_total",
         "Checkpoints written (periodic and job ones).", kCounter,
         [](const S& s) -> double { return s.checkpoints_written(); }),
    Read(kShard, "asyncps_shard_checkpoints_failed_total",
         "Checkpoints that could not be written.", kCounter,
         [](const S& s) -> double { return s.checkpoints_failed(); }),
    Read(kShard, "asyncps_shard_last_checkpoint_timestamp_seconds",
         "When the last checkpoint was written (Unix time; 0: none yet).",
         kGauge,
         [](const S& s) { return s.last_checkpoint_timestamp_seconds(); }),
    Read(kShard, "asyncps_shard_checkpoint_write_seconds",
         "How long the last checkpoint took to write.", kGauge,
         [](const S& s) { return s.checkpoint_write_seconds(); }),
    Read(kShard, "asyncps_shard_checkpoint_bytes",
         "Size of the last checkpoint.", kGauge,
         [](const S& s) -> double { return s.checkpoint_bytes(); }),
    Read(kShard, "asyncps_shard_start_timestamp_seconds",
         "When the shard started (Unix time).", kGauge,
         [](const S& s) { return s.start_timestamp_seconds(); }),
    Read(kReplica, "asyncps_replica_epoch",
         "The epoch of the primary this member serves or follows.", kGauge,
         [](const S& s) -> double { return s.replica().epoch(); }),
    Read(kReplica, "asyncps_replica_backups",
         "Primary: backups in its stream now (0: the group has no backup).",
         kGauge,
         [](const S& s) -> double {
           const v1::ReplicaStats& r = s.replica();
           return r.role() == "primary" ? r.backups_size() : 0;
         }),
    Read(kReplica, "asyncps_replica_in_sync",
         "Primary: members holding every acknowledged change, itself "
         "included (0 on other members).",
         kGauge, [](const S& s) -> double { return s.replica().in_sync(); }),
    Read(kReplica, "asyncps_replica_min_insync",
         "--min_insync: below it the primary refuses changes.", kGauge,
         [](const S& s) -> double { return s.replica().min_insync(); }),
    Read(kReplica, "asyncps_replica_below_min_insync_total",
         "Primary: changes refused, or applied but not acknowledged, while "
         "fewer than --min_insync members held them.",
         kCounter,
         [](const S& s) -> double { return s.replica().below_min_insync(); }),
    Read(kReplica, "asyncps_replica_lag_ops",
         "Primary: the most changes a backup has not acknowledged.", kGauge,
         [](const S& s) -> double { return s.replica().lag(); }),
    Read(kReplica, "asyncps_replica_applied_ops",
         "Changes this member applied (backup) or streamed (primary).", kGauge,
         [](const S& s) -> double { return s.replica().applied_seq(); }),
    Read(kReplica, "asyncps_replica_bytes_total",
         "Bytes of changes streamed to backups (primary) or applied (backup).",
         kCounter,
         [](const S& s) -> double { return s.replica().replicated_bytes(); }),
    Read(kReplica, "asyncps_replica_failovers_total",
         "Times this member became its group's primary.", kCounter,
         [](const S& s) -> double { return s.replica().failovers(); }),
    Read(kSsp, "asyncps_shard_staleness_bound",
         "ssp: --staleness, the clock gap pulls are held to.", kGauge,
         [](const S& s) -> double { return s.staleness_bound(); }),
};

// Each ShardCounter is in exactly one row (and no row names kCount).
constexpr bool EachCounterHasOneRow() {
  for (int k = 0; k < kNumShardCounters; ++k) {
    int rows = 0;
    for (const StatRow& row : kRows) {
      if (row.counted() && static_cast<int>(row.counter) == k) ++rows;
    }
    if (rows != 1) return false;
  }
  for (const StatRow& row : kRows) {
    if (row.counted() && row.counter == ShardCounter::kCount) return false;
  }
  return true;
}
static_assert(EachCounterHasOneRow(),
              "every ShardCounter needs exactly one row in kRows");

}  // namespace

absl::Span<const StatRow> StatRows() { return kRows; }

v1::StatsResponse CollectStats(const ShardParts& parts) {
  v1::StatsResponse r;
  ShardCounters c = parts.store->Counters();
  for (const StatRow& row : kRows) {
    if (row.counted()) (r.*row.set)(c[row.counter]);
  }
  r.set_shard(parts.store->shard());
  r.set_num_shards(parts.num_shards);
  r.set_model_declared(parts.store->declared());
  r.set_model_name(parts.store->model_name());
  r.set_num_slices(parts.store->num_slices());
  r.set_num_bytes(parts.store->num_bytes());
  for (int64_t n : c.staleness_histogram) {
    r.add_staleness_histogram(n);
  }
  for (v1::WorkerInfo& w : parts.membership->Workers()) {
    *r.add_workers() = std::move(w);
  }
  r.set_uptime_seconds(absl::ToDoubleSeconds(parts.clock->Now() - parts.start));
  r.set_start_timestamp_seconds(
      absl::ToDoubleSeconds(parts.start - absl::UnixEpoch()));
  r.set_mode(ModeName(parts.consistency->config().mode));
  if (parts.consistency->config().mode == Mode::kSsp) {
    r.set_staleness_bound(parts.consistency->config().staleness);
  }
  r.set_held_pulls(parts.consistency->held_pulls());
  r.set_live_workers(parts.membership->LiveCount());
  r.set_job_done(parts.membership->AllFinished());
  if (parts.tables != nullptr) {
    for (v1::EmbeddingStats& e : parts.tables->Stats()) {
      *r.add_embeddings() = std::move(e);
    }
  }
  r.set_max_clock_gap(parts.membership->MaxClockGap());
  r.set_incarnation(parts.store->incarnation());
  r.set_awaiting_restore(parts.consistency->AwaitingRestore());
  const auto [lo, hi] =
      parts.store->Progress(parts.consistency->config().mode == Mode::kBsp);
  r.set_stall(parts.consistency->Stall());
  r.set_oldest_held_pull_seconds(
      absl::ToDoubleSeconds(parts.consistency->OldestHeld()));
  r.set_min_version(lo);
  r.set_max_version(hi);
  r.set_checkpoint_age_seconds(-1);
  if (parts.checkpointer != nullptr) {
    const Checkpointer::Record k = parts.checkpointer->record();
    r.set_checkpoints_written(k.written);
    r.set_checkpoints_failed(k.failed);
    if (k.written > 0) {
      r.set_checkpoint_age_seconds(
          absl::ToDoubleSeconds(parts.clock->Now() - k.last));
      r.set_last_checkpoint_timestamp_seconds(
          absl::ToDoubleSeconds(k.last - absl::UnixEpoch()));
      r.set_checkpoint_write_seconds(absl::ToDoubleSeconds(k.took));
      r.set_checkpoint_bytes(k.bytes);
    }
  }
  if (const Replication* replication = parts.consistency->replication();
      replication != nullptr) {
    *r.mutable_replica() = replication->Stats();
  }
  r.set_version(kAsyncpsVersion);
  r.set_commit(kAsyncpsCommit);
  r.set_max_shard_bytes(parts.store->max_shard_bytes());
  r.set_rss_bytes(ResidentBytes());
  r.set_memory_limit_bytes(CgroupMemoryLimitBytes());
  return r;
}

}  // namespace asyncps
