#include "client/embedding_client.h"

#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/model_spec.h"  // CheckRows
#include "common/partitioner.h"
#include "common/status_macros.h"

namespace asyncps {
namespace {

// The ids each shard gets, and where each of them came from in the
// request: shard s asks for ids_of[s], whose k-th answer row goes to row
// from[s][k] of the caller's (a repeated id is asked for once per shard
// and answered to each of its places).
struct Routes {
  std::vector<std::vector<int64_t>> ids_of;
  std::vector<std::vector<std::vector<size_t>>> from;
};

Routes Route(absl::Span<const int64_t> ids, int num_shards) {
  Routes r;
  r.ids_of.resize(num_shards);
  r.from.resize(num_shards);
  absl::flat_hash_map<int64_t, size_t> slot;  // id -> its index in ids_of.
  for (size_t k = 0; k < ids.size(); ++k) {
    const int s = RowShard(ids[k], num_shards);
    auto [it, fresh] = slot.try_emplace(ids[k], r.ids_of[s].size());
    if (fresh) {
      r.ids_of[s].push_back(ids[k]);
      r.from[s].emplace_back();
    }
    r.from[s][it->second].push_back(k);
  }
  return r;
}

std::string Bytes(const void* data, size_t n) {
  return std::string(static_cast<const char*>(data), n);
}

// Each row of shard `shard`'s answer `got` into its places in `rows`.
absl::Status Scatter(const char* what, int shard, const std::string& got,
                     const Routes& routes, size_t d, absl::Span<float> rows) {
  const size_t n = routes.ids_of[shard].size();
  if (got.size() != n * d * sizeof(float)) {
    return absl::InternalError(
        absl::StrCat(what, ": shard ", shard, " answered ", got.size(),
                     " bytes for ", n, " rows of dim ", d));
  }
  for (size_t i = 0; i < n; ++i) {
    for (size_t k : routes.from[shard][i]) {
      std::memcpy(&rows[k * d], got.data() + i * d * sizeof(float),
                  d * sizeof(float));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status EmbeddingClient::Declare(const v1::EmbeddingSpec& spec) {
  std::vector<
      ShardCall<v1::DeclareEmbeddingRequest, v1::DeclareEmbeddingResponse>>
      calls(caller_->num_shards());
  for (int s = 0; s < caller_->num_shards(); ++s) {
    calls[s].shard = s;
    *calls[s].request.mutable_spec() = spec;
  }
  RETURN_IF_ERROR(caller_->CallAll(&calls, ASYNCPS_RPC(DeclareEmbedding),
                                   "DeclareEmbedding", /*idempotent=*/true));
  absl::MutexLock lock(&mu_);
  specs_[spec.name()] = spec;
  return absl::OkStatus();
}

absl::StatusOr<v1::EmbeddingSpec> EmbeddingClient::Spec(
    const std::string& table) const {
  absl::MutexLock lock(&mu_);
  auto it = specs_.find(table);
  if (it == specs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("embedding '", table,
                     "' was not declared by this client (Declare "
                     "it with its spec first: the call is idempotent)"));
  }
  return it->second;
}

absl::Status EmbeddingClient::PullRows(const std::string& table,
                                       absl::Span<const int64_t> ids,
                                       absl::Span<float> rows) {
  RETURN_IF_ERROR(TakeStepError());
  ASSIGN_OR_RETURN(const v1::EmbeddingSpec spec, Spec(table));
  const int64_t dim = spec.dim();
  const size_t d = static_cast<size_t>(dim);
  RETURN_IF_ERROR(CheckRows(spec, ids));
  if (rows.size() != ids.size() * d) {
    return absl::InvalidArgumentError(
        absl::StrCat("PullRows: ", ids.size(), " ids of dim ", dim, " into ",
                     rows.size(), " floats"));
  }
  const Routes routes = Route(ids, caller_->num_shards());
  std::vector<ShardCall<v1::PullRowsRequest, v1::PullRowsResponse>> calls;
  for (int s = 0; s < caller_->num_shards(); ++s) {
    if (routes.ids_of[s].empty() && !every_shard()) continue;
    auto& c = calls.emplace_back();
    c.shard = s;
    c.request.set_table(table);
    c.request.set_clock(clock());
    c.request.set_ids(Bytes(routes.ids_of[s].data(),
                            routes.ids_of[s].size() * sizeof(int64_t)));
  }
  RETURN_IF_ERROR(Redeclaring(spec, [&] {
    return caller_->Exchange(&calls, FrameOp::kPullRows, ASYNCPS_RPC(PullRows),
                             "PullRows", /*idempotent=*/true);
  }));
  for (const auto& c : calls) {
    RETURN_IF_ERROR(
        Scatter("PullRows", c.shard, c.response.rows(), routes, d, rows));
  }
  return absl::OkStatus();
}

absl::Status EmbeddingClient::PushRows(const std::string& table,
                                       absl::Span<const int64_t> ids,
                                       absl::Span<const float> grads) {
  return Push(table, ids, grads, {}, {}, /*fused=*/false);
}

absl::Status EmbeddingClient::PushPullRows(const std::string& table,
                                           absl::Span<const int64_t> ids,
                                           absl::Span<const float> grads,
                                           absl::Span<const int64_t> pull_ids,
                                           absl::Span<float> rows) {
  return Push(table, ids, grads, pull_ids, rows, /*fused=*/true);
}

absl::Status EmbeddingClient::Push(const std::string& table,
                                   absl::Span<const int64_t> ids,
                                   absl::Span<const float> grads,
                                   absl::Span<const int64_t> pull_ids,
                                   absl::Span<float> rows, bool fused) {
  RETURN_IF_ERROR(TakeStepError());
  ASSIGN_OR_RETURN(const v1::EmbeddingSpec spec, Spec(table));
  const int64_t dim = spec.dim();
  const size_t d = static_cast<size_t>(dim);
  if (grads.size() != ids.size() * d) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushRows: ", ids.size(), " ids of dim ", dim, " and ",
                     grads.size(), " gradient floats"));
  }
  if (rows.size() != pull_ids.size() * d) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushPullRows: ", pull_ids.size(), " ids to pull of dim ",
                     dim, " into ", rows.size(), " floats"));
  }
  RETURN_IF_ERROR(CheckRows(spec, ids, grads));
  RETURN_IF_ERROR(CheckRows(spec, pull_ids));
  if (!every_shard()) return Send(spec, ids, grads, pull_ids, rows, fused);
  // bsp: one push of the table per step, its pushes summed.
  AddToStep(table, d, ids, grads);
  if (!fused) return absl::OkStatus();
  std::vector<int64_t> step_ids;
  std::vector<float> step_grads;
  TakeStep(table, &step_ids, &step_grads);
  return Send(spec, step_ids, step_grads, pull_ids, rows, /*fused=*/true);
}

absl::Status EmbeddingClient::AwaitJoinedStep(const std::string& table) {
  if (!every_shard() || !steps_.joined_at || steps_.joined_at() <= 0) {
    return absl::OkStatus();
  }
  {
    absl::MutexLock lock(&mu_);
    if (awaited_.contains(table)) return absl::OkStatus();
  }
  // Held on each shard until the table's step clock() (>= M) is applied.
  RETURN_IF_ERROR(PullRows(table, {}, {}));
  absl::MutexLock lock(&mu_);
  awaited_.insert(table);
  return absl::OkStatus();
}

absl::Status EmbeddingClient::Send(const v1::EmbeddingSpec& spec,
                                   absl::Span<const int64_t> ids,
                                   absl::Span<const float> grads,
                                   absl::Span<const int64_t> pull_ids,
                                   absl::Span<float> rows, bool fused) {
  const std::string& table = spec.name();
  const size_t d = static_cast<size_t>(spec.dim());
  RETURN_IF_ERROR(AwaitJoinedStep(table));
  // Each shard gets its ids once, their gradients summed here (the shard
  // would sum them too; this sends fewer bytes), and the ids to pull.
  const int num_shards = caller_->num_shards();
  const Routes push = Route(ids, num_shards);
  const Routes pull = Route(pull_ids, num_shards);
  std::vector<ShardCall<v1::PushRowsRequest, v1::PushRowsResponse>> calls;
  for (int s = 0; s < num_shards; ++s) {
    const size_t n = push.ids_of[s].size();
    if (n == 0 && pull.ids_of[s].empty() && !every_shard()) continue;
    std::vector<float> summed(n * d, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      for (size_t k : push.from[s][i]) {
        for (size_t j = 0; j < d; ++j) summed[i * d + j] += grads[k * d + j];
      }
    }
    auto& c = calls.emplace_back();
    c.shard = s;
    c.request.set_table(table);
    c.request.set_ids(Bytes(push.ids_of[s].data(), n * sizeof(int64_t)));
    c.request.set_grads(Bytes(summed.data(), summed.size() * sizeof(float)));
    c.request.set_pull_ids(
        Bytes(pull.ids_of[s].data(), pull.ids_of[s].size() * sizeof(int64_t)));
    c.request.set_clock(clock() + 1);
    c.request.set_fused(fused);
    // Exactly-once: a retry (here or in the caller) carries the same pair.
    c.request.set_client_id(caller_->client_id());
    c.request.set_sequence(caller_->NextSequence());
  }
  RETURN_IF_ERROR(Redeclaring(spec, [&] {
    return caller_->Exchange(&calls, FrameOp::kPushRows, ASYNCPS_RPC(PushRows),
                             "PushRows");
  }));
  for (const auto& c : calls) {
    if (!fused) continue;
    RETURN_IF_ERROR(
        Scatter("PushPullRows", c.shard, c.response.rows(), pull, d, rows));
  }
  return absl::OkStatus();
}

void EmbeddingClient::AddToStep(const std::string& table, size_t dim,
                                absl::Span<const int64_t> ids,
                                absl::Span<const float> grads) {
  absl::MutexLock lock(&mu_);
  StepRows& step = step_[table];
  for (size_t k = 0; k < ids.size(); ++k) {
    auto [it, fresh] = step.at.try_emplace(ids[k], step.ids.size());
    if (fresh) {
      step.ids.push_back(ids[k]);
      step.grads.resize(step.grads.size() + dim, 0.0f);
    }
    float* to = &step.grads[it->second * dim];
    for (size_t j = 0; j < dim; ++j) to[j] += grads[k * dim + j];
  }
}

void EmbeddingClient::TakeStep(const std::string& table,
                               std::vector<int64_t>* ids,
                               std::vector<float>* grads) {
  absl::MutexLock lock(&mu_);
  step_sent_.insert(table);
  auto it = step_.find(table);
  if (it == step_.end()) return;
  *ids = std::move(it->second.ids);
  *grads = std::move(it->second.grads);
  step_.erase(it);
}

absl::Status EmbeddingClient::TakeStepError() {
  absl::MutexLock lock(&mu_);
  return std::exchange(step_error_, absl::OkStatus());
}

absl::Status EmbeddingClient::EndStep() {
  if (!every_shard()) return absl::OkStatus();
  std::vector<v1::EmbeddingSpec> specs;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, spec] : specs_) {
      if (!step_sent_.contains(name)) specs.push_back(spec);
    }
  }
  absl::Status failed;
  for (const v1::EmbeddingSpec& spec : specs) {
    std::vector<int64_t> ids;
    std::vector<float> grads;
    TakeStep(spec.name(), &ids, &grads);
    absl::Status s = Send(spec, ids, grads, {}, {}, /*fused=*/false);
    if (failed.ok() && !s.ok()) failed = std::move(s);
  }
  absl::MutexLock lock(&mu_);
  step_sent_.clear();
  if (!failed.ok()) step_error_ = failed;
  return failed;
}

absl::Status EmbeddingClient::Redeclaring(
    const v1::EmbeddingSpec& spec, const std::function<absl::Status()>& call) {
  absl::Status s = call();
  if (!absl::IsNotFound(s)) return s;
  // A shard restarted without a checkpoint holds no table: declare it again
  // everywhere (idempotent) and send the same requests again (the same
  // sequence numbers: a shard that applied a push answers from its ledger).
  RETURN_IF_ERROR(Declare(spec));
  return call();
}

absl::Status EmbeddingClient::ReadAll(const std::string& table,
                                      std::vector<int64_t>* ids,
                                      std::vector<float>* rows) {
  for (int s = 0; s < caller_->num_shards(); ++s) {
    // A shard that restarted or failed over between pages holds no longer
    // the read's snapshot: its part is read again from the start.
    const size_t ids_before = ids->size(), rows_before = rows->size();
    absl::Status read;
    for (int attempt = 0; attempt < 3; ++attempt) {
      ids->resize(ids_before);
      rows->resize(rows_before);
      read = ReadShard(s, table, ids, rows);
      if (!absl::IsFailedPrecondition(read)) break;
    }
    RETURN_IF_ERROR(read);
  }
  return absl::OkStatus();
}

absl::Status EmbeddingClient::ReadShard(int shard, const std::string& table,
                                        std::vector<int64_t>* ids,
                                        std::vector<float>* rows) {
  constexpr int64_t kPage = 65536;
  v1::ReadRowsRequest request;
  request.set_table(table);
  request.set_max_rows(kPage);
  for (int64_t start = 0; start >= 0;) {
    request.set_start(start);
    ASSIGN_OR_RETURN(const v1::ReadRowsResponse page,
                     caller_->CallOne<v1::ReadRowsResponse>(
                         shard, request, ASYNCPS_RPC(ReadRows), "ReadRows",
                         /*idempotent=*/true));
    const std::string& id_bytes = page.ids();
    const size_t n = id_bytes.size() / sizeof(int64_t);
    if (id_bytes.size() % sizeof(int64_t) != 0 ||
        (n == 0 ? !page.rows().empty()
                : page.rows().size() % (n * sizeof(float)) != 0)) {
      return absl::InternalError(
          absl::StrCat("ReadRows: shard ", shard, " answered ", id_bytes.size(),
                       " bytes of ids and ", page.rows().size(), " of rows"));
    }
    const size_t old = ids->size();
    ids->resize(old + n);
    if (n > 0) std::memcpy(&(*ids)[old], id_bytes.data(), id_bytes.size());
    const size_t floats = page.rows().size() / sizeof(float);
    const size_t old_rows = rows->size();
    rows->resize(old_rows + floats);
    if (floats > 0) {
      std::memcpy(&(*rows)[old_rows], page.rows().data(), page.rows().size());
    }
    request.set_snapshot(page.snapshot());
    start = page.next();
  }
  return absl::OkStatus();
}

}  // namespace asyncps
