// EmbeddingTables (declared in server/embedding_table.h): a shard's
// embedding tables by name, declared, found, counted, saved and restored.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "server/embedding_table.h"

namespace asyncps {

absl::Status EmbeddingTables::Declare(const v1::EmbeddingSpec& spec,
                                      const absl::Status& may_create) {
  RETURN_IF_ERROR(ValidateEmbedding(spec));
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(spec.name());
  if (it != tables_.end()) {
    if (it->second->spec().SerializeAsString() != spec.SerializeAsString()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "embedding '", spec.name(), "' is declared with another spec (",
          it->second->spec().ShortDebugString(), ")"));
    }
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(may_create);
  if (tables_.size() >= kMaxTables) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "a shard holds at most ", kMaxTables, " embedding tables"));
  }
  tables_.emplace(spec.name(), std::make_unique<EmbeddingTable>(spec));
  return absl::OkStatus();
}

absl::StatusOr<EmbeddingTable*> EmbeddingTables::Find(
    const std::string& name) const {
  absl::MutexLock lock(&mu_);
  auto it = tables_.find(name);
  if (it == tables_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no embedding '", name.substr(0, 64),
                     "' on this shard (DeclareEmbedding first)"));
  }
  return it->second.get();
}

size_t EmbeddingTables::size() const {
  absl::MutexLock lock(&mu_);
  return tables_.size();
}

std::vector<EmbeddingTable*> EmbeddingTables::All() const {
  absl::MutexLock lock(&mu_);
  std::vector<EmbeddingTable*> all;
  all.reserve(tables_.size());
  for (const auto& [name, table] : tables_) all.push_back(table.get());
  return all;
}

std::vector<v1::EmbeddingStats> EmbeddingTables::Stats() const {
  std::vector<v1::EmbeddingStats> out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [name, table] : tables_) out.push_back(table->Stats());
  }
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.name() < b.name(); });
  return out;
}

void EmbeddingTables::Save(v1::ShardCheckpoint* checkpoint) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [name, table] : tables_) {
    table->Save(checkpoint->add_embeddings());
  }
}

int EmbeddingTables::AdvanceSteps(int quorum, absl::Duration deadline,
                                  absl::Time now, absl::Duration heal_after,
                                  const std::vector<int>& live_ranks,
                                  const NotSending& not_sending,
                                  std::vector<std::string>* healed) {
  int applied = 0;
  for (EmbeddingTable* table : All()) {
    if (table->CompleteStep(quorum, deadline, now)) ++applied;
    if (heal_after <= absl::ZeroDuration()) continue;
    std::vector<int> left_out;
    if (table->Heal(live_ranks, not_sending, heal_after, now, &left_out)) {
      ++applied;
      healed->push_back(absl::StrCat(
          "step ", table->applied_step(), " of embedding '",
          table->spec().name(), "' without ", left_out.size(), " rank(s)"));
    }
  }
  return applied;
}

absl::Status EmbeddingTables::Restore(const v1::ShardCheckpoint& checkpoint) {
  absl::flat_hash_map<std::string, std::unique_ptr<EmbeddingTable>> loaded;
  for (const v1::EmbeddingCheckpoint& e : checkpoint.embeddings()) {
    ASSIGN_OR_RETURN(std::unique_ptr<EmbeddingTable> table,
                     EmbeddingTable::Load(e));
    if (!loaded.emplace(e.spec().name(), std::move(table)).second) {
      return absl::DataLossError(absl::StrCat("checkpoint holds embedding '",
                                              e.spec().name(), "' twice"));
    }
  }
  absl::MutexLock lock(&mu_);
  tables_ = std::move(loaded);
  return absl::OkStatus();
}

}  // namespace asyncps
