#include "server/checkpoint_restore.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {

RestoreSink::RestoreSink(ShardStore* store, EmbeddingTables* tables)
    : store_(store), tables_(tables) {}

absl::Status RestoreSink::Refused(absl::Status s) {
  if (!s.ok()) refused_ = true;
  return s;
}

absl::Status RestoreSink::Head(const v1::ShardCheckpoint& head) {
  head_ = head;
  if (!head.has_spec()) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<ShardStore::Restoring>> restoring =
      store_->StartRestore(head);
  if (!restoring.ok()) return Refused(restoring.status());
  restoring_ = *std::move(restoring);
  return absl::OkStatus();
}

absl::Status RestoreSink::Slice(v1::SliceCheckpoint* slice) {
  if (restoring_ == nullptr) {
    return absl::DataLossError(
        absl::StrCat("slice ", slice->slice(), " in a checkpoint of no model"));
  }
  ++slices_;
  return Refused(restoring_->Load(*slice));
}

absl::Status RestoreSink::Table(v1::EmbeddingCheckpoint* table) {
  if (tables_ == nullptr) {
    return absl::DataLossError(absl::StrCat(
        "embedding table '", table->spec().name(), "' where none belong"));
  }
  tables_in_.add_embeddings()->Swap(table);
  return absl::OkStatus();
}

absl::Status RestoreSink::Finish() {
  // The tables first: their restore checks them all before it replaces
  // anything, while a published model cannot be taken back.
  if (tables_ != nullptr)
    RETURN_IF_ERROR(Refused(tables_->Restore(tables_in_)));
  if (restoring_ != nullptr) {
    RETURN_IF_ERROR(Refused(store_->FinishRestore(std::move(restoring_))));
  }
  return absl::OkStatus();
}

}  // namespace asyncps
