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
constexpr MetricType kCounter = MetricType::Counter;
constexpr MetricType kGauge = MetricType::Gauge;

// The table's rows of `section` (server/edge/shard_stats.h), one family per
// run of rows of one name.
void AddRows(const v1::StatsResponse& s, StatSection section,
             std::vector<MetricFamily>* out) {
  const char* last = nullptr;
  for (const StatRow& row : StatRows()) {
    if (row.section != section) continue;
    const MetricType type = row.kind == StatKind::kCounter ? kCounter : kGauge;
    if (last == nullptr || std::string(last) != row.name) {
      out->push_back(Family(row.name, row.help, type));
      last = row.name;
    }
    std::vector<ClientMetric::Label> labels;
    if (row.label_name != nullptr) {
      labels.push_back({row.label_name, row.label_value});
    }
    out->back().metric.push_back(Sample(type, row.Value(s), labels));
  }
}

// The staleness of every slice update: bucket k counts staleness k, the last
// one everything larger (its samples count at its lower bound in the sum).
void AddStaleness(const v1::StatsResponse& s, std::vector<MetricFamily>* out) {
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
  out->push_back(std::move(f));
}

// Each registered worker, as this shard sees it.
void AddWorkers(const v1::StatsResponse& s, std::vector<MetricFamily>* out) {
  MetricFamily clock = Family("asyncps_shard_worker_clock",
                              "Steps each worker has completed.", kGauge);
  MetricFamily heard =
      Family("asyncps_shard_worker_last_seen_timestamp_seconds",
             "When each worker was last heard from (Unix time).", kGauge);
  MetricFamily live =
      Family("asyncps_shard_worker_live", "1 if the worker is live.", kGauge);
  MetricFamily finished = Family(
      "asyncps_shard_worker_finished",
      "1 if the worker said it was done (it left the job cleanly).", kGauge);
  for (const v1::WorkerInfo& w : s.workers()) {
    std::vector<ClientMetric::Label> labels = {{"rank", absl::StrCat(w.rank())},
                                               {"host", w.host()}};
    clock.metric.push_back(Sample(kGauge, w.clock(), labels));
    heard.metric.push_back(
        Sample(kGauge, w.last_seen_timestamp_seconds(), labels));
    live.metric.push_back(Sample(kGauge, w.live() ? 1 : 0, labels));
    finished.metric.push_back(Sample(kGauge, w.finished() ? 1 : 0, labels));
  }
  out->push_back(std::move(clock));
  out->push_back(std::move(heard));
  out->push_back(std::move(live));
  out->push_back(std::move(finished));
}

// What each worker reported on its last heartbeat, as this shard heard it
// (every shard has it: query one shard, or take the max per rank). Named
// apart from the worker's own asyncps_worker_* series, so a sum over both
// counts nothing twice.
void AddWorkerProgress(const v1::StatsResponse& s,
                       std::vector<MetricFamily>* out) {
  MetricFamily samples =
      Family("asyncps_shard_worker_samples_total",
             "Examples a worker process trained on, as it reported.", kCounter);
  MetricFamily rate =
      Family("asyncps_shard_worker_samples_per_second",
             "A worker's recent training rate, as it reported.", kGauge);
  MetricFamily loss =
      Family("asyncps_shard_worker_loss",
             "A worker's last training loss, as it reported.", kGauge);
  MetricFamily phases =
      Family("asyncps_shard_worker_step_seconds_total",
             "Seconds a worker spent per phase of its steps: data (reading "
             "minibatches), compute (forward, backward), exchange (waiting for "
             "the servers or the ring).",
             kCounter);
  for (const v1::WorkerInfo& w : s.workers()) {
    const v1::WorkerProgress& p = w.progress();
    const std::string rank = absl::StrCat(w.rank());
    samples.metric.push_back(Sample(kCounter, p.samples(), {{"rank", rank}}));
    rate.metric.push_back(
        Sample(kGauge, p.samples_per_second(), {{"rank", rank}}));
    loss.metric.push_back(Sample(kGauge, p.loss(), {{"rank", rank}}));
    phases.metric.push_back(Sample(kCounter, p.data_seconds(),
                                   {{"rank", rank}, {"phase", "data"}}));
    phases.metric.push_back(Sample(kCounter, p.compute_seconds(),
                                   {{"rank", rank}, {"phase", "compute"}}));
    phases.metric.push_back(Sample(kCounter, p.exchange_seconds(),
                                   {{"rank", rank}, {"phase", "exchange"}}));
  }
  out->push_back(std::move(samples));
  out->push_back(std::move(rate));
  out->push_back(std::move(loss));
  out->push_back(std::move(phases));
}

// A replicated shard's member (ps_server --replicas): its role as a label,
// then the table's replica rows.
void AddReplica(const v1::StatsResponse& s, std::vector<MetricFamily>* out) {
  out->push_back(
      OneSample("asyncps_replica_role",
                "This member's role in its shard group; the value is 1.",
                kGauge, 1, {{"role", s.replica().role()}}));
  AddRows(s, StatSection::kReplica, out);
}

void AddInfo(const v1::StatsResponse& s, std::vector<MetricFamily>* out) {
  out->push_back(OneSample(
      "asyncps_shard_info", "The shard's identity; the value is 1.", kGauge, 1,
      {{"shard", absl::StrCat(s.shard())},
       {"num_shards", absl::StrCat(s.num_shards())},
       {"mode", s.mode()},
       {"model", s.model_name()},
       {"incarnation", absl::StrCat(absl::Hex(s.incarnation()))}}));
}

// This shard's part of each embedding table, by its name.
void AddEmbeddings(const v1::StatsResponse& s, std::vector<MetricFamily>* out) {
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
      {"asyncps_shard_embedding_expired_rows_total",
       "Rows removed untouched past the table's ttl.",
       &v1::EmbeddingStats::expired},
      {"asyncps_shard_embedding_not_admitted_total",
       "Row pushes dropped before the id's admit_count-th push.",
       &v1::EmbeddingStats::not_admitted},
  };
  if (s.embeddings_size() == 0) return;
  for (const TableMetric& m : kTableMetrics) {
    // The first is a gauge (rows held now), the rest count since the start.
    const MetricType type = &m == &kTableMetrics[0] ? kGauge : kCounter;
    MetricFamily f = Family(m.name, m.help, type);
    for (const v1::EmbeddingStats& e : s.embeddings()) {
      f.metric.push_back(Sample(type, static_cast<double>((e.*m.value)()),
                                {{"table", e.name()}}));
    }
    out->push_back(std::move(f));
  }
}

}  // namespace

std::vector<MetricFamily> StatsToMetrics(const v1::StatsResponse& s) {
  std::vector<MetricFamily> out;
  AddRows(s, StatSection::kCalls, &out);
  AddStaleness(s, &out);
  AddRows(s, StatSection::kWorkers, &out);
  AddWorkers(s, &out);
  AddWorkerProgress(s, &out);
  AddRows(s, StatSection::kShard, &out);
  if (s.has_replica()) AddReplica(s, &out);
  if (s.mode() == "ssp") AddRows(s, StatSection::kSsp, &out);
  AddInfo(s, &out);
  AddEmbeddings(s, &out);
  return out;
}

}  // namespace asyncps
