#include "common/file_system.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

absl::Status Errno(absl::string_view op, const std::string& path, int err) {
  const std::string message =
      absl::StrCat(path, ": ", op, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(message);
    case ENOSPC:
    case EDQUOT:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

class PosixWritableFile final : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd)
      : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) close(fd_);
  }

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t n = write(fd_, data.data(), data.size());
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("write", path_, n < 0 ? errno : ENOSPC);
      data.remove_prefix(static_cast<size_t>(n));
    }
    return absl::OkStatus();
  }

  absl::Status Sync() override {
    if (fsync(fd_) != 0) return Errno("fsync", path_, errno);
    return absl::OkStatus();
  }

  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    if (fd >= 0 && close(fd) != 0) return Errno("close", path_, errno);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  int fd_;
};

class PosixSequentialFile final : public SequentialFile {
 public:
  PosixSequentialFile(std::string path, int fd)
      : path_(std::move(path)), fd_(fd) {}
  ~PosixSequentialFile() override { close(fd_); }

  absl::Status Read(size_t n, std::string* out) override {
    const size_t start = out->size();
    out->resize(start + n);
    size_t got = 0;
    while (got < n) {
      const ssize_t r = read(fd_, &(*out)[start + got], n - got);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        const int err = errno;
        out->resize(start + got);
        return Errno("read", path_, err);
      }
      if (r == 0) break;
      got += static_cast<size_t>(r);
    }
    out->resize(start + got);
    return absl::OkStatus();
  }

 private:
  const std::string path_;
  const int fd_;
};

// A whole file read up front, served piece by piece.
class StringSequentialFile final : public SequentialFile {
 public:
  explicit StringSequentialFile(std::string data) : data_(std::move(data)) {}
  absl::Status Read(size_t n, std::string* out) override {
    n = std::min(n, data_.size() - at_);
    out->append(data_, at_, n);
    at_ += n;
    return absl::OkStatus();
  }

 private:
  const std::string data_;
  size_t at_ = 0;
};

class PosixFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", path, errno);
    return std::make_unique<PosixSequentialFile>(path, fd);
  }

  absl::StatusOr<uint64_t> FileSize(const std::string& path) override {
    struct stat st;
    if (stat(path.c_str(), &st) != 0) return Errno("stat", path, errno);
    return static_cast<uint64_t>(st.st_size);
  }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    const int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Errno("open", path, errno);
    return std::make_unique<PosixWritableFile>(path, fd);
  }

  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", path, errno);
    std::string data;
    char buf[1 << 16];
    while (true) {
      const ssize_t n = read(fd, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        const int err = errno;
        close(fd);
        return Errno("read", path, err);
      }
      if (n == 0) break;
      data.append(buf, static_cast<size_t>(n));
    }
    close(fd);
    return data;
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (rename(from.c_str(), to.c_str()) != 0)
      return Errno("rename", to, errno);
    return absl::OkStatus();
  }

  absl::Status Delete(const std::string& path) override {
    if (unlink(path.c_str()) != 0) return Errno("unlink", path, errno);
    return absl::OkStatus();
  }

  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    DIR* d = opendir(dir.c_str());
    if (d == nullptr) return Errno("opendir", dir, errno);
    std::vector<std::string> names;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    closedir(d);
    return names;
  }

  absl::Status SyncDir(const std::string& dir) override {
    const int fd = open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return Errno("open", dir, errno);
    const int rc = fsync(fd);
    const int err = errno;
    close(fd);
    if (rc != 0) return Errno("fsync", dir, err);
    return absl::OkStatus();
  }
};

}  // namespace

absl::StatusOr<uint64_t> FileSystem::FileSize(const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) return data.status();
  return static_cast<uint64_t>(data->size());
}

absl::StatusOr<std::unique_ptr<SequentialFile>> FileSystem::NewSequentialFile(
    const std::string& path) {
  absl::StatusOr<std::string> data = ReadFile(path);
  if (!data.ok()) return data.status();
  return std::make_unique<StringSequentialFile>(*std::move(data));
}

FileSystem* FileSystem::Default() {
  static FileSystem* fs = new PosixFileSystem;
  return fs;
}

absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                 absl::string_view contents) {
  const std::string tmp = path + ".tmp";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = fs->NewWritableFile(tmp);
  if (!file.ok()) return file.status();
  absl::Status s = (*file)->Append(contents);
  if (s.ok()) s = (*file)->Close();
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) fs->Delete(tmp).IgnoreError();
  return s;
}

}  // namespace asyncps
