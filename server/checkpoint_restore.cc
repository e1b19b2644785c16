#include "server/checkpoint_restore.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
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

namespace {

double Mb(uint64_t bytes) { return static_cast<double>(bytes) / 1e6; }

}  // namespace

RestoreProgress::RestoreProgress(std::string path, uint64_t total, Clock* clock,
                                 Say say, absl::Duration every)
    : path_(std::move(path)),
      total_(total),
      clock_(clock),
      say_(std::move(say)),
      every_(every),
      start_(clock->Now()),
      said_(start_) {}

void RestoreProgress::operator()(uint64_t bytes) {
  bytes_ = bytes;
  const absl::Time now = clock_->Now();
  if (now - said_ < every_) return;
  said_ = now;
  const double seconds = absl::ToDoubleSeconds(now - start_);
  const double rate = seconds > 0 ? Mb(bytes) / seconds : 0;
  const bool known = total_ > 0 && bytes <= total_;  // The file's size.
  std::string line = absl::StrFormat("restoring %s: %.0f", path_, Mb(bytes));
  if (known) {
    absl::StrAppendFormat(
        &line, " of %.0f MB (%.0f %%)", Mb(total_),
        100.0 * static_cast<double>(bytes) / static_cast<double>(total_));
  } else {
    absl::StrAppend(&line, " MB");
  }
  absl::StrAppendFormat(&line, ", %.0f MB/s", rate);
  if (known && rate > 0) {
    absl::StrAppendFormat(&line, ", ETA %.0f s", Mb(total_ - bytes) / rate);
  }
  say_(line);
}

std::string RestoreProgress::Done() const {
  const double seconds = absl::ToDoubleSeconds(clock_->Now() - start_);
  return absl::StrFormat("%.0f MB in %.1f s (%.0f MB/s)", Mb(bytes_), seconds,
                         seconds > 0 ? Mb(bytes_) / seconds : 0.0);
}

}  // namespace asyncps
