#include "server/checkpoint.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status.h"

namespace asyncps {
namespace {

constexpr char kMagic[8] = {'A', 'S', 'Y', 'N', 'C', 'P', 'S', 'C'};
constexpr uint32_t kFormat = 1;
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 4;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return v;
}

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

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

// Writes `data` to `tmp` and makes it durable.
absl::Status WriteDurably(FileSystem* fs, const std::string& tmp,
                          absl::string_view data) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   fs->NewWritableFile(tmp));
  RETURN_IF_ERROR(file->Append(data));
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
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
                                 const v1::ShardCheckpoint& checkpoint) {
  std::string payload;
  if (!checkpoint.SerializeToString(&payload)) {
    return absl::InternalError(absl::StrCat(path, ": cannot serialize"));
  }
  std::string data(kMagic, sizeof(kMagic));
  PutLe(&data, kFormat, 4);
  PutLe(&data, payload.size(), 8);
  PutLe(&data,
        crc32(0L, reinterpret_cast<const Bytef*>(payload.data()),
              static_cast<uInt>(payload.size())),
        4);
  data += payload;
  const std::string tmp = path + ".tmp";
  absl::Status s = WriteDurably(fs, tmp, data);
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    fs->Delete(tmp).IgnoreError();  // It may not exist.
    return s;
  }
  // The rename is in place; a failed directory fsync only risks losing
  // this newest file at a power cut, which the older ones survive.
  fs->SyncDir(DirOf(path)).IgnoreError();
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardCheckpoint> ReadCheckpointFile(
    FileSystem* fs, const std::string& path) {
  ASSIGN_OR_RETURN(const std::string data, fs->ReadFile(path));
  auto loss = [&](absl::string_view why) {
    return absl::DataLossError(absl::StrCat(path, ": ", why));
  };
  if (data.size() < kHeaderBytes) return loss("truncated header");
  if (std::memcmp(data.data(), kMagic, sizeof(kMagic)) != 0) {
    return loss("bad magic: not an asyncps checkpoint");
  }
  const uint64_t format = GetLe(data.data() + 8, 4);
  if (format != kFormat) {
    return loss(absl::StrCat("unknown format version ", format));
  }
  const uint64_t length = GetLe(data.data() + 12, 8);
  const uint64_t crc = GetLe(data.data() + 20, 4);
  if (data.size() - kHeaderBytes != length) {
    return loss(absl::StrCat("truncated: header says ", length,
                             " payload bytes, file has ",
                             data.size() - kHeaderBytes));
  }
  const char* payload = data.data() + kHeaderBytes;
  if (crc32(0L, reinterpret_cast<const Bytef*>(payload),
            static_cast<uInt>(length)) != crc) {
    return loss("checksum mismatch");
  }
  v1::ShardCheckpoint checkpoint;
  if (!checkpoint.ParseFromArray(payload, static_cast<int>(length))) {
    return loss("payload does not parse");
  }
  return checkpoint;
}

absl::StatusOr<v1::ShardCheckpoint> LoadNewestCheckpoint(
    FileSystem* fs, const std::string& dir, int shard,
    std::vector<std::string>* skipped) {
  std::vector<std::string> names = List(fs, dir, shard);
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    auto c = ReadCheckpointFile(fs, absl::StrCat(dir, "/", *it));
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

absl::StatusOr<v1::ShardCheckpoint> Checkpointer::Take() const {
  v1::ShardCheckpoint snapshot;
  if (store_->declared()) {
    ASSIGN_OR_RETURN(snapshot, store_->Snapshot());
  } else if (HasState()) {
    snapshot.set_shard(shard_);  // Tables alone: no spec, no slices.
  } else {
    return absl::FailedPreconditionError(
        "no model and no embedding table to checkpoint");
  }
  if (tables_ != nullptr) tables_->Save(&snapshot);
  return snapshot;
}

absl::StatusOr<std::string> Checkpointer::Write() {
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(v1::ShardCheckpoint snapshot, Take());
  const absl::Time now = clock_->Now();
  snapshot.set_unix_micros(absl::ToUnixMicros(now));
  const std::string path =
      CheckpointPath(dir_, shard_, absl::ToUnixMicros(now));
  RETURN_IF_ERROR(WriteAndRecord(path, snapshot));
  last_ = now;
  PruneCheckpoints(fs_, dir_, shard_, keep_);
  return path;
}

absl::StatusOr<std::string> Checkpointer::WriteJob(const std::string& tag) {
  RETURN_IF_ERROR(CheckJobTag(tag));
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(v1::ShardCheckpoint snapshot, Take());
  snapshot.set_unix_micros(absl::ToUnixMicros(clock_->Now()));
  const std::string path = JobCheckpointPath(dir_, tag, shard_);
  RETURN_IF_ERROR(WriteAndRecord(path, snapshot));
  return path;
}

absl::Status Checkpointer::WriteAndRecord(const std::string& path,
                                          const v1::ShardCheckpoint& snapshot) {
  const absl::Time start = clock_->Now();
  const auto bytes = static_cast<int64_t>(snapshot.ByteSizeLong());
  ScopedSpan span(timeline_, "checkpoint", "checkpoint");
  span.set_arg("bytes", bytes);
  absl::Status s = WriteCheckpointFile(fs_, path, snapshot);
  if (!s.ok()) {
    ++record_.failed;
    return s;
  }
  ++record_.written;
  record_.last = clock_->Now();
  record_.took = record_.last - start;
  record_.bytes = bytes;
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
