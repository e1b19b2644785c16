#include "server/edge/metrics.h"

#include <limits>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/metric_families.h"

namespace asyncps {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

void Add(std::vector<MetricFamily>* out, const char* name, const char* help,
         MetricType type, double value) {
  out->push_back(OneSample(name, help, type, value));
}

}  // namespace

std::vector<MetricFamily> StatsToMetrics(const v1::StatsResponse& s) {
  std::vector<MetricFamily> out;
  const auto counter = MetricType::Counter;
  const auto gauge = MetricType::Gauge;
  Add(&out, "asyncps_shard_pushes_total", "Push calls accepted.", counter,
      s.pushes());
  Add(&out, "asyncps_shard_pulls_total", "Pull calls answered.", counter,
      s.pulls());
  Add(&out, "asyncps_shard_rejected_requests_total",
      "Calls refused by validation.", counter, s.rejected_requests());
  Add(&out, "asyncps_shard_updates_applied_total",
      "Slice updates applied (optimizer steps on one slice).", counter,
      s.updates_applied());
  Add(&out, "asyncps_shard_duplicate_pushes_total",
      "Retried pushes answered from the ledger, not applied again.", counter,
      s.duplicate_pushes());
  Add(&out, "asyncps_shard_bsp_steps_applied_total",
      "bsp: slice steps applied.", counter, s.steps_applied());
  Add(&out, "asyncps_shard_bsp_steps_short_total",
      "bsp: slice steps applied with fewer gradients than live workers.",
      counter, s.steps_short());
  Add(&out, "asyncps_shard_held_pulls_total",
      "ssp/bsp: pulls that had to wait.", counter, s.held_pulls());
  {
    MetricFamily f = Family("asyncps_shard_dropped_gradients_total",
                            "Slice gradients not applied, by reason.", counter);
    f.metric.push_back(
        Sample(counter, s.dropped_stale(), {{"reason", "stale"}}));
    f.metric.push_back(Sample(counter, s.dropped_late(), {{"reason", "late"}}));
    f.metric.push_back(
        Sample(counter, s.dropped_restarted(), {{"reason", "restarted"}}));
    out.push_back(std::move(f));
  }
  {
    // The staleness of every slice update: bucket k counts staleness k, the
    // last one everything larger (its samples count at its lower bound in
    // the sum).
    MetricFamily f = Family("asyncps_shard_update_staleness",
                            "Versions applied between a gradient's pull and "
                            "its push, per slice update.",
                            MetricType::Histogram);
    ClientMetric m;
    uint64_t cumulative = 0;
    double sum = 0;
    const int n = s.staleness_histogram_size();
    for (int k = 0; k < n; ++k) {
      const int64_t count = s.staleness_histogram(k);
      cumulative += static_cast<uint64_t>(count);
      sum += static_cast<double>(k) * static_cast<double>(count);
      if (k + 1 < n) {
        m.histogram.bucket.push_back({cumulative, static_cast<double>(k)});
      }
    }
    m.histogram.bucket.push_back(
        {cumulative, std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = sum;
    f.metric.push_back(std::move(m));
    out.push_back(std::move(f));
  }
  Add(&out, "asyncps_shard_live_workers", "Workers heard from lately.", gauge,
      s.live_workers());
  Add(&out, "asyncps_shard_registered_workers",
      "Ranks that have registered since the shard started.", gauge,
      s.workers_size());
  {
    MetricFamily clock = Family("asyncps_shard_worker_clock",
                                "Steps each worker has completed.", gauge);
    MetricFamily heard =
        Family("asyncps_shard_worker_last_seen_timestamp_seconds",
               "When each worker was last heard from (Unix time).", gauge);
    MetricFamily live =
        Family("asyncps_shard_worker_live", "1 if the worker is live.", gauge);
    MetricFamily finished = Family(
        "asyncps_shard_worker_finished",
        "1 if the worker said it was done (it left the job cleanly).", gauge);
    for (const v1::WorkerInfo& w : s.workers()) {
      std::vector<ClientMetric::Label> labels = {
          {"rank", absl::StrCat(w.rank())}, {"host", w.host()}};
      clock.metric.push_back(Sample(gauge, w.clock(), labels));
      heard.metric.push_back(
          Sample(gauge, w.last_seen_timestamp_seconds(), labels));
      live.metric.push_back(Sample(gauge, w.live() ? 1 : 0, labels));
      finished.metric.push_back(Sample(gauge, w.finished() ? 1 : 0, labels));
    }
    out.push_back(std::move(clock));
    out.push_back(std::move(heard));
    out.push_back(std::move(live));
    out.push_back(std::move(finished));
  }
  {
    // What each worker reported on its last heartbeat, as this shard heard
    // it (every shard has it: query one shard, or take the max per rank).
    // Named apart from the worker's own asyncps_worker_* series, so a sum
    // over both counts nothing twice.
    MetricFamily samples = Family(
        "asyncps_shard_worker_samples_total",
        "Examples a worker process trained on, as it reported.", counter);
    MetricFamily rate =
        Family("asyncps_shard_worker_samples_per_second",
               "A worker's recent training rate, as it reported.", gauge);
    MetricFamily loss =
        Family("asyncps_shard_worker_loss",
               "A worker's last training loss, as it reported.", gauge);
    MetricFamily phases = Family(
        "asyncps_shard_worker_step_seconds_total",
        "Seconds a worker spent per phase of its steps: data (reading "
        "minibatches), compute (forward, backward), exchange (waiting for "
        "the servers or the ring).",
        counter);
    for (const v1::WorkerInfo& w : s.workers()) {
      const v1::WorkerProgress& p = w.progress();
      const std::string rank = absl::StrCat(w.rank());
      samples.metric.push_back(Sample(counter, p.samples(), {{"rank", rank}}));
      rate.metric.push_back(
          Sample(gauge, p.samples_per_second(), {{"rank", rank}}));
      loss.metric.push_back(Sample(gauge, p.loss(), {{"rank", rank}}));
      phases.metric.push_back(Sample(counter, p.data_seconds(),
                                     {{"rank", rank}, {"phase", "data"}}));
      phases.metric.push_back(Sample(counter, p.compute_seconds(),
                                     {{"rank", rank}, {"phase", "compute"}}));
      phases.metric.push_back(Sample(counter, p.exchange_seconds(),
                                     {{"rank", rank}, {"phase", "exchange"}}));
    }
    out.push_back(std::move(samples));
    out.push_back(std::move(rate));
    out.push_back(std::move(loss));
    out.push_back(std::move(phases));
  }
  Add(&out, "asyncps_shard_max_clock_gap",
      "Largest gap seen between two live workers' clocks.", gauge,
      s.max_clock_gap());
  Add(&out, "asyncps_shard_slices", "Slices this shard holds.", gauge,
      s.num_slices());
  Add(&out, "asyncps_shard_weight_bytes", "Weight bytes this shard holds.",
      gauge, s.num_bytes());
  Add(&out, "asyncps_shard_slice_version_min",
      "Lowest slice version (bsp: step applied).", gauge, s.min_version());
  Add(&out, "asyncps_shard_slice_version_max",
      "Highest slice version (bsp: step applied).", gauge, s.max_version());
  Add(&out, "asyncps_shard_awaiting_restore",
      "1 while the shard waits for a worker's copy of a lost model.", gauge,
      s.awaiting_restore() ? 1 : 0);
  Add(&out, "asyncps_shard_oldest_held_pull_seconds",
      "ssp/bsp: how long the longest-held pull has waited (0: none held).",
      gauge, s.oldest_held_pull_seconds());
  Add(&out, "asyncps_shard_stalled",
      "1 while a held pull has waited past --stall_warn (psctl status says "
      "for whom).",
      gauge, s.stall().empty() ? 0 : 1);
  Add(&out, "asyncps_shard_checkpoints_written_total",
      "Checkpoints written (periodic and job ones).", counter,
      s.checkpoints_written());
  Add(&out, "asyncps_shard_checkpoints_failed_total",
      "Checkpoints that could not be written.", counter,
      s.checkpoints_failed());
  Add(&out, "asyncps_shard_last_checkpoint_timestamp_seconds",
      "When the last checkpoint was written (Unix time; 0: none yet).", gauge,
      s.last_checkpoint_timestamp_seconds());
  Add(&out, "asyncps_shard_checkpoint_write_seconds",
      "How long the last checkpoint took to write.", gauge,
      s.checkpoint_write_seconds());
  Add(&out, "asyncps_shard_checkpoint_bytes", "Size of the last checkpoint.",
      gauge, s.checkpoint_bytes());
  Add(&out, "asyncps_shard_start_timestamp_seconds",
      "When the shard started (Unix time).", gauge,
      s.start_timestamp_seconds());
  if (s.has_replica()) {
    // A replicated shard's member (ps_server --replicas).
    const v1::ReplicaStats& r = s.replica();
    MetricFamily role =
        Family("asyncps_replica_role",
               "This member's role in its shard group; the value is 1.", gauge);
    role.metric.push_back(Sample(gauge, 1, {{"role", r.role()}}));
    out.push_back(std::move(role));
    Add(&out, "asyncps_replica_epoch",
        "The epoch of the primary this member serves or follows.", gauge,
        r.epoch());
    Add(&out, "asyncps_replica_backups",
        "Primary: backups in its stream now (0: the group has no backup).",
        gauge, r.role() == "primary" ? r.backups_size() : 0);
    Add(&out, "asyncps_replica_lag_ops",
        "Primary: the most changes a backup has not acknowledged.", gauge,
        r.lag());
    Add(&out, "asyncps_replica_applied_ops",
        "Changes this member applied (backup) or streamed (primary).", gauge,
        r.applied_seq());
    Add(&out, "asyncps_replica_bytes_total",
        "Bytes of changes streamed to backups (primary) or applied (backup).",
        counter, r.replicated_bytes());
    Add(&out, "asyncps_replica_failovers_total",
        "Times this member became its group's primary.", counter,
        r.failovers());
  }
  if (s.mode() == "ssp") {
    Add(&out, "asyncps_shard_staleness_bound",
        "ssp: --staleness, the clock gap pulls are held to.", gauge,
        s.staleness_bound());
  }
  {
    MetricFamily f = Family("asyncps_shard_info",
                            "The shard's identity; the value is 1.", gauge);
    f.metric.push_back(
        Sample(gauge, 1,
               {{"shard", absl::StrCat(s.shard())},
                {"num_shards", absl::StrCat(s.num_shards())},
                {"mode", s.mode()},
                {"model", s.model_name()},
                {"incarnation", absl::StrCat(absl::Hex(s.incarnation()))}}));
    out.push_back(std::move(f));
  }
  // This shard's part of each embedding table, by its name.
  struct TableMetric {
    const char* name;
    const char* help;
    int64_t (v1::EmbeddingStats::*value)() const;
  };
  static constexpr TableMetric kTableMetrics[] = {
      {"asyncps_shard_embedding_rows", "Rows of the table this shard holds.",
       &v1::EmbeddingStats::rows},
      {"asyncps_shard_embedding_evicted_rows_total",
       "Rows that gave way to new ones (max_rows_per_shard).",
       &v1::EmbeddingStats::evicted},
      {"asyncps_shard_embedding_rows_pulled_total", "Row ids answered.",
       &v1::EmbeddingStats::rows_pulled},
      {"asyncps_shard_embedding_rows_pushed_total",
       "Row updates applied (a push's repeats summed first).",
       &v1::EmbeddingStats::rows_pushed},
      {"asyncps_shard_embedding_received_bytes_total",
       "Bytes of ids and gradients received by row calls.",
       &v1::EmbeddingStats::bytes_received},
      {"asyncps_shard_embedding_sent_bytes_total",
       "Bytes of rows sent by row calls.", &v1::EmbeddingStats::bytes_sent},
      {"asyncps_shard_embedding_duplicate_pushes_total",
       "Retried pushes of rows answered from the ledger, not applied again.",
       &v1::EmbeddingStats::duplicate_pushes},
  };
  for (const TableMetric& m : kTableMetrics) {
    if (s.embeddings_size() == 0) break;
    // The first is a gauge (rows held now), the rest count since the start.
    const auto type = &m == &kTableMetrics[0] ? gauge : counter;
    MetricFamily f = Family(m.name, m.help, type);
    for (const v1::EmbeddingStats& e : s.embeddings()) {
      f.metric.push_back(Sample(type, static_cast<double>((e.*m.value)()),
                                {{"table", e.name()}}));
    }
    out.push_back(std::move(f));
  }
  return out;
}

}  // namespace asyncps
