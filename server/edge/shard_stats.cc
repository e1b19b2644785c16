#include "server/edge/shard_stats.h"

namespace asyncps {

v1::StatsResponse CollectStats(const ShardParts& parts) {
  v1::StatsResponse r;
  ShardCounters c = parts.store->Counters();
  r.set_shard(parts.store->shard());
  r.set_num_shards(parts.num_shards);
  r.set_model_declared(parts.store->declared());
  r.set_model_name(parts.store->model_name());
  r.set_num_slices(parts.store->num_slices());
  r.set_num_bytes(parts.store->num_bytes());
  r.set_updates_applied(c.updates_applied);
  r.set_pushes(c.pushes);
  r.set_pulls(c.pulls);
  r.set_rejected_requests(c.rejected);
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
  r.set_dropped_stale(c.dropped_stale);
  r.set_dropped_late(c.dropped_late);
  r.set_steps_applied(c.steps_applied);
  r.set_steps_short(c.steps_short);
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
  r.set_dropped_restarted(c.dropped_restarted);
  r.set_duplicate_pushes(c.duplicate_pushes);
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
  return r;
}

}  // namespace asyncps
