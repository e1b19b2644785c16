#include "server/rows.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"  // CheckRows
#include "common/status_macros.h"

namespace asyncps {
namespace {

// The ids a request carries (little-endian int64), each of them one that
// RowShard gives this shard.
absl::StatusOr<std::vector<int64_t>> Ids(const std::string& bytes, int shard,
                                         int num_shards) {
  if (bytes.size() % sizeof(int64_t) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ids of ", bytes.size(), " bytes: not a whole number of int64s"));
  }
  if (bytes.size() / sizeof(int64_t) > kMaxRowsPerCall) {
    return absl::ResourceExhaustedError(
        absl::StrCat(bytes.size() / sizeof(int64_t),
                     " ids in one call; at most ", kMaxRowsPerCall));
  }
  std::vector<int64_t> ids(bytes.size() / sizeof(int64_t));
  if (!ids.empty()) std::memcpy(ids.data(), bytes.data(), bytes.size());
  for (int64_t id : ids) {
    if (RowShard(id, num_shards) != shard) {
      return absl::InvalidArgumentError(absl::StrCat(
          "id ", id, " belongs to shard ", RowShard(id, num_shards), ", not ",
          shard, " (RowShard)"));
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<RowPull> ResolvePullRows(EmbeddingTables* tables, int shard,
                                        int num_shards,
                                        const std::string& table,
                                        const std::string& ids) {
  RowPull pull;
  ASSIGN_OR_RETURN(pull.table, tables->Find(table));
  ASSIGN_OR_RETURN(pull.ids, Ids(ids, shard, num_shards));
  RETURN_IF_ERROR(CheckRows(pull.table->spec(), pull.ids));
  return pull;
}

absl::Status FinishPullRows(const RowPull& pull, std::string* rows) {
  std::vector<float> values(pull.ids.size() *
                            static_cast<size_t>(pull.table->spec().dim()));
  RETURN_IF_ERROR(pull.table->Pull(pull.ids, absl::MakeSpan(values)));
  rows->assign(reinterpret_cast<const char*>(values.data()),
               values.size() * sizeof(float));
  pull.table->CountBytes(pull.ids.size() * sizeof(int64_t), rows->size());
  return absl::OkStatus();
}

absl::Status ServePullRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PullRowsRequest& request,
                           v1::PullRowsResponse* response) {
  ASSIGN_OR_RETURN(const RowPull pull,
                   ResolvePullRows(tables, shard, num_shards, request.table(),
                                   request.ids()));
  return FinishPullRows(pull, response->mutable_rows());
}

absl::Status ServePushRows(EmbeddingTables* tables, int shard, int num_shards,
                           const v1::PushRowsRequest& request,
                           v1::PushRowsResponse* response,
                           const RowPolicy& policy, bool* applied) {
  if (applied != nullptr) *applied = false;
  ASSIGN_OR_RETURN(EmbeddingTable * table, tables->Find(request.table()));
  RowsLedger& ledger = tables->ledger();
  const RowsLedger::Verdict verdict = ledger.Begin(request, response);
  if (verdict == RowsLedger::Verdict::kAnswered) {
    table->CountDuplicatePush();
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(RowsLedger::Refusal(verdict, request));
  absl::Status s = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(const std::vector<int64_t> ids,
                     Ids(request.ids(), shard, num_shards));
    const std::string& bytes = request.grads();
    if (bytes.size() % sizeof(float) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradients of ", bytes.size(), " bytes: not a whole number of f32s"));
    }
    std::vector<float> grads(bytes.size() / sizeof(float));
    if (!grads.empty()) std::memcpy(grads.data(), bytes.data(), bytes.size());
    if (!policy.bsp) return table->Push(ids, grads);
    return table->AddToStep(request.rank(), request.clock(), ids, grads,
                            policy.quorum, policy.now);
  }();
  ledger.Finish(request, s, *response);
  table->CountBytes(request.ids().size() + request.grads().size(), 0);
  if (applied != nullptr) *applied = s.ok();
  return s;
}

ShardStore::StepsAdvanced AdvanceShardSteps(
    ShardStore* store, EmbeddingTables* tables,
    const ShardStore::StepAdvance& advance) {
  ShardStore::StepsAdvanced done = store->AdvanceSteps(advance);
  if (tables != nullptr) {
    done.completed += tables->AdvanceSteps(
        advance.quorum, advance.deadline, advance.now,
        advance.heal ? advance.heal_after : absl::ZeroDuration(),
        advance.live_ranks, advance.not_sending, &done.healed);
  }
  return done;
}

absl::Status ServeReadRows(EmbeddingTables* tables,
                           const v1::ReadRowsRequest& request,
                           v1::ReadRowsResponse* response) {
  ASSIGN_OR_RETURN(EmbeddingTable * table, tables->Find(request.table()));
  if (request.start() < 0 || request.max_rows() < 1 ||
      request.max_rows() > 65536) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReadRows: start ", request.start(), ", max_rows ", request.max_rows(),
        " (want start >= 0, max_rows in "
        "[1, 65536])"));
  }
  std::vector<int64_t> ids;
  std::vector<float> rows;
  uint64_t snapshot = request.snapshot();
  ASSIGN_OR_RETURN(const int64_t next,
                   table->Read(&snapshot, request.start(), request.max_rows(),
                               &ids, &rows, absl::Now()));
  response->set_next(next);
  response->set_snapshot(snapshot);
  response->set_ids(reinterpret_cast<const char*>(ids.data()),
                    ids.size() * sizeof(int64_t));
  response->set_rows(reinterpret_cast<const char*>(rows.data()),
                     rows.size() * sizeof(float));
  return absl::OkStatus();
}

}  // namespace asyncps
