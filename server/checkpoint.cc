#include "server/checkpoint.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace asyncps {
namespace {

std::string Prefix(int shard) { return absl::StrCat("shard-", shard, "-"); }

// The checkpoint files of `shard` in `dir`, oldest first; none if the
// directory cannot be listed.
std::vector<std::string> List(FileSystem* fs, const std::string& dir,
                              int shard) {
  std::vector<std::string> names;
  auto entries = fs->ListDir(dir);
  if (!entries.ok()) return names;
  for (std::string& name : *entries) {
    if (absl::StartsWith(name, Prefix(shard)) &&
        absl::EndsWith(name, ".ckpt")) {
      names.push_back(std::move(name));
    }
  }
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int shard,
                           int64_t unix_micros) {
  return absl::StrFormat("%s/%s%020d.ckpt", dir, Prefix(shard), unix_micros);
}

std::string JobCheckpointPath(const std::string& dir, const std::string& tag,
                              int shard) {
  return absl::StrCat(dir, "/job-", tag, "-shard-", shard, ".ckpt");
}

absl::Status CheckJobTag(const std::string& tag) {
  if (tag.empty() || tag.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "job checkpoint tag '", tag, "' must have 1 to 64 characters"));
  }
  for (char c : tag) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '_' &&
        c != '.' && c != '-') {
      return absl::InvalidArgumentError(absl::StrCat(
          "job checkpoint tag '", tag, "' may hold only [A-Za-z0-9_.-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status WriteCheckpointFile(FileSystem* fs, const std::string& path,
                                 const v1::ShardCheckpoint& checkpoint,
                                 size_t chunk_bytes) {
  return WriteChunkedFile(
      fs, path,
      [&](CheckpointSink* sink) { return FeedCheckpoint(checkpoint, sink); },
      chunk_bytes);
}

absl::StatusOr<v1::ShardCheckpoint> ReadCheckpointFile(
    FileSystem* fs, const std::string& path) {
  CheckpointCollector collected;
  RETURN_IF_ERROR(ReadChunkedFile(fs, path, &collected));
  return std::move(collected.checkpoint());
}

std::vector<std::string> CheckpointFiles(FileSystem* fs, const std::string& dir,
                                         int shard) {
  std::vector<std::string> paths;
  std::vector<std::string> names = List(fs, dir, shard);
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    paths.push_back(absl::StrCat(dir, "/", *it));
  }
  return paths;
}

absl::StatusOr<v1::ShardCheckpoint> LoadNewestCheckpoint(
    FileSystem* fs, const std::string& dir, int shard,
    std::vector<std::string>* skipped) {
  for (const std::string& path : CheckpointFiles(fs, dir, shard)) {
    auto c = ReadCheckpointFile(fs, path);
    if (c.ok()) return c;
    if (skipped != nullptr) skipped->push_back(c.status().ToString());
  }
  return absl::NotFoundError(
      absl::StrCat("no valid checkpoint of shard ", shard, " in ", dir));
}

void PruneCheckpoints(FileSystem* fs, const std::string& dir, int shard,
                      int keep) {
  std::vector<std::string> names = List(fs, dir, shard);
  for (size_t i = 0; i + keep < names.size(); ++i) {
    fs->Delete(absl::StrCat(dir, "/", names[i])).IgnoreError();
  }
}

Checkpointer::Checkpointer(ShardStore* store, FileSystem* fs, std::string dir,
                           int shard, int keep, absl::Duration every,
                           Clock* clock)
    : store_(store),
      fs_(fs),
      dir_(std::move(dir)),
      shard_(shard),
      keep_(keep),
      every_(every),
      clock_(clock),
      last_(clock->Now()) {}

bool Checkpointer::HasState() const {
  return store_->declared() || (tables_ != nullptr && tables_->size() > 0);
}

absl::Status Checkpointer::Take(int64_t unix_micros,
                                CheckpointSink* sink) const {
  if (store_->declared()) {
    RETURN_IF_ERROR(store_->Snapshot(/*pending=*/false, unix_micros, sink));
  } else if (HasState()) {
    v1::ShardCheckpoint head;  // Tables alone: no spec, no slices.
    head.set_shard(shard_);
    head.set_unix_micros(unix_micros);
    RETURN_IF_ERROR(sink->Head(head));
  } else {
    return absl::FailedPreconditionError(
        "no model and no embedding table to checkpoint");
  }
  if (tables_ == nullptr) return absl::OkStatus();
  // One table's copy at a time.
  for (const EmbeddingTable* table : tables_->All()) {
    v1::EmbeddingCheckpoint saved;
    table->Save(&saved);
    RETURN_IF_ERROR(sink->Table(&saved));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> Checkpointer::Write() {
  absl::MutexLock lock(&mu_);
  if (!HasState()) {
    return absl::FailedPreconditionError(
        "no model and no embedding table to checkpoint");
  }
  const absl::Time now = clock_->Now();
  const std::string path =
      CheckpointPath(dir_, shard_, absl::ToUnixMicros(now));
  RETURN_IF_ERROR(WriteAndRecord(path, now));
  last_ = now;
  PruneCheckpoints(fs_, dir_, shard_, keep_);
  return path;
}

absl::StatusOr<std::string> Checkpointer::WriteJob(const std::string& tag) {
  RETURN_IF_ERROR(CheckJobTag(tag));
  absl::MutexLock lock(&mu_);
  if (!HasState()) {
    return absl::FailedPreconditionError(
        "no model and no embedding table to checkpoint");
  }
  const std::string path = JobCheckpointPath(dir_, tag, shard_);
  RETURN_IF_ERROR(WriteAndRecord(path, clock_->Now()));
  return path;
}

absl::Status Checkpointer::WriteAndRecord(const std::string& path,
                                          absl::Time now) {
  const absl::Time start = clock_->Now();
  ScopedSpan span(timeline_, "checkpoint", "checkpoint");
  uint64_t bytes = 0;
  absl::Status s = WriteChunkedFile(
      fs_, path,
      [&](CheckpointSink* sink) { return Take(absl::ToUnixMicros(now), sink); },
      chunk_bytes_, &bytes);
  span.set_arg("bytes", static_cast<int64_t>(bytes));
  if (!s.ok()) {
    ++record_.failed;
    return s;
  }
  ++record_.written;
  record_.last = clock_->Now();
  record_.took = record_.last - start;
  record_.bytes = static_cast<int64_t>(bytes);
  return s;
}

Checkpointer::Record Checkpointer::record() const {
  absl::MutexLock lock(&mu_);
  return record_;
}

void Checkpointer::MaybeWrite(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (every_ <= absl::ZeroDuration() || now - last_ < every_) return;
    last_ = now;  // Also when there is no model yet: try again next period.
  }
  if (HasState()) Write().IgnoreError();
}

}  // namespace asyncps
