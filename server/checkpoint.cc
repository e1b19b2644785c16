#include "server/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

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

absl::Status Errno(absl::string_view what, const std::string& path) {
  return absl::InternalError(
      absl::StrCat(path, ": ", what, ": ", std::strerror(errno)));
}

std::string Prefix(int shard) { return absl::StrCat("shard-", shard, "-"); }

// The checkpoint files of `shard` in `dir`, oldest first.
std::vector<std::string> List(const std::string& dir, int shard) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (absl::StartsWith(name, Prefix(shard)) &&
        absl::EndsWith(name, ".ckpt")) {
      names.push_back(name);
    }
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

std::string CheckpointPath(const std::string& dir, int shard,
                           int64_t unix_micros) {
  return absl::StrFormat("%s/%s%020d.ckpt", dir, Prefix(shard), unix_micros);
}

absl::Status WriteCheckpointFile(const std::string& path,
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
  const int fd =
      open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("open", tmp);
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status s = Errno("write", tmp);
      close(fd);
      unlink(tmp.c_str());
      return s;
    }
    done += n;
  }
  if (fsync(fd) != 0) {
    absl::Status s = Errno("fsync", tmp);
    close(fd);
    unlink(tmp.c_str());
    return s;
  }
  close(fd);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status s = Errno("rename", path);
    unlink(tmp.c_str());
    return s;
  }
  const std::string dir = path.substr(0, path.rfind('/'));
  const int dfd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    close(dfd);
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ShardCheckpoint> ReadCheckpointFile(
    const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat(path, ": no such file"));
    }
    return Errno("open", path);
  }
  std::string data;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status s = Errno("read", path);
      close(fd);
      return s;
    }
    if (n == 0) break;
    data.append(buf, n);
  }
  close(fd);
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
    const std::string& dir, int shard, std::vector<std::string>* skipped) {
  std::vector<std::string> names = List(dir, shard);
  for (auto it = names.rbegin(); it != names.rend(); ++it) {
    auto c = ReadCheckpointFile(absl::StrCat(dir, "/", *it));
    if (c.ok()) return c;
    if (skipped != nullptr) skipped->push_back(c.status().ToString());
  }
  return absl::NotFoundError(
      absl::StrCat("no valid checkpoint of shard ", shard, " in ", dir));
}

void PruneCheckpoints(const std::string& dir, int shard, int keep) {
  std::vector<std::string> names = List(dir, shard);
  for (size_t i = 0; i + keep < names.size(); ++i) {
    unlink(absl::StrCat(dir, "/", names[i]).c_str());
  }
}

Checkpointer::Checkpointer(ShardStore* store, std::string dir, int shard,
                           int keep, absl::Duration every, Clock* clock)
    : store_(store),
      dir_(std::move(dir)),
      shard_(shard),
      keep_(keep),
      every_(every),
      clock_(clock),
      last_(clock->Now()) {}

absl::StatusOr<std::string> Checkpointer::Write() {
  absl::MutexLock lock(&mu_);
  auto snapshot = store_->Snapshot();
  if (!snapshot.ok()) return snapshot.status();
  const absl::Time now = clock_->Now();
  snapshot->set_unix_micros(absl::ToUnixMicros(now));
  const std::string path =
      CheckpointPath(dir_, shard_, absl::ToUnixMicros(now));
  absl::Status s = WriteCheckpointFile(path, *snapshot);
  if (!s.ok()) return s;
  last_ = now;
  PruneCheckpoints(dir_, shard_, keep_);
  return path;
}

void Checkpointer::MaybeWrite(absl::Time now) {
  {
    absl::MutexLock lock(&mu_);
    if (every_ <= absl::ZeroDuration() || now - last_ < every_) return;
    last_ = now;  // Also when there is no model yet: try again next period.
  }
  if (store_->declared()) Write().IgnoreError();
}

}  // namespace asyncps
