#include "client/embedding_client.h"

#include <cstring>
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
  std::vector<int> shard_of;
  for (int s = 0; s < caller_->num_shards(); ++s) {
    if (routes.ids_of[s].empty()) continue;
    auto& c = calls.emplace_back();
    c.shard = s;
    c.request.set_table(table);
    c.request.set_ids(Bytes(routes.ids_of[s].data(),
                            routes.ids_of[s].size() * sizeof(int64_t)));
  }
  RETURN_IF_ERROR(caller_->Exchange(&calls, FrameOp::kPullRows,
                                    ASYNCPS_RPC(PullRows), "PullRows",
                                    /*idempotent=*/true));
  for (const auto& c : calls) {
    const std::string& got = c.response.rows();
    const size_t n = routes.ids_of[c.shard].size();
    if (got.size() != n * d * sizeof(float)) {
      return absl::InternalError(
          absl::StrCat("PullRows: shard ", c.shard, " answered ", got.size(),
                       " bytes for ", n, " rows of dim ", dim));
    }
    for (size_t i = 0; i < n; ++i) {
      for (size_t k : routes.from[c.shard][i]) {
        std::memcpy(&rows[k * d], got.data() + i * d * sizeof(float),
                    d * sizeof(float));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EmbeddingClient::PushRows(const std::string& table,
                                       absl::Span<const int64_t> ids,
                                       absl::Span<const float> grads) {
  ASSIGN_OR_RETURN(const v1::EmbeddingSpec spec, Spec(table));
  const int64_t dim = spec.dim();
  const size_t d = static_cast<size_t>(dim);
  if (grads.size() != ids.size() * d) {
    return absl::InvalidArgumentError(
        absl::StrCat("PushRows: ", ids.size(), " ids of dim ", dim, " and ",
                     grads.size(), " gradient floats"));
  }
  RETURN_IF_ERROR(CheckRows(spec, ids, grads));
  // Each shard gets its ids once, their gradients summed here (the shard
  // would sum them too; this sends fewer bytes).
  const Routes routes = Route(ids, caller_->num_shards());
  std::vector<ShardCall<v1::PushRowsRequest, v1::PushRowsResponse>> calls;
  for (int s = 0; s < caller_->num_shards(); ++s) {
    const size_t n = routes.ids_of[s].size();
    if (n == 0) continue;
    std::vector<float> summed(n * d, 0.0f);
    for (size_t i = 0; i < n; ++i) {
      for (size_t k : routes.from[s][i]) {
        for (size_t j = 0; j < d; ++j) summed[i * d + j] += grads[k * d + j];
      }
    }
    auto& c = calls.emplace_back();
    c.shard = s;
    c.request.set_table(table);
    c.request.set_ids(Bytes(routes.ids_of[s].data(), n * sizeof(int64_t)));
    c.request.set_grads(Bytes(summed.data(), summed.size() * sizeof(float)));
  }
  return caller_->Exchange(&calls, FrameOp::kPushRows, ASYNCPS_RPC(PushRows),
                           "PushRows");
}

}  // namespace asyncps
