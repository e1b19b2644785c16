#include "common/testing/fault_file_system.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace asyncps::testing {
namespace {

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "" : path.substr(0, slash);
}

}  // namespace

class FaultFileSystem::Writer final : public WritableFile {
 public:
  Writer(FaultFileSystem* fs, std::shared_ptr<File> file, std::string path)
      : fs_(fs), file_(std::move(file)), path_(std::move(path)) {}
  absl::Status Append(absl::string_view data) override {
    return fs_->Append(file_.get(), data, path_);
  }
  absl::Status Sync() override { return fs_->Sync(file_.get(), path_); }
  absl::Status Close() override { return absl::OkStatus(); }

 private:
  FaultFileSystem* const fs_;
  const std::shared_ptr<File> file_;
  const std::string path_;
};

absl::StatusOr<std::unique_ptr<WritableFile>> FaultFileSystem::NewWritableFile(
    const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto file = std::make_shared<File>();
  files_[path] = file;
  return std::make_unique<Writer>(this, std::move(file), path);
}

absl::Status FaultFileSystem::Append(File* file, absl::string_view data,
                                     const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (space_left_ >= 0 && static_cast<int64_t>(data.size()) > space_left_) {
    file->data.append(data.data(), static_cast<size_t>(space_left_));
    space_left_ = 0;
    return absl::ResourceExhaustedError(
        absl::StrCat(path, ": write: No space left on device"));
  }
  if (space_left_ >= 0) space_left_ -= static_cast<int64_t>(data.size());
  file->data.append(data.data(), data.size());
  return absl::OkStatus();
}

absl::Status FaultFileSystem::Sync(File* file, const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (fail_sync_) {
    return absl::InternalError(
        absl::StrCat(path, ": fsync: Input/output error"));
  }
  file->synced = file->data;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FaultFileSystem::ReadFile(const std::string& path) {
  absl::MutexLock lock(&mu_);
  auto it = files_.find(path);
  if (it == files_.end()) {
    return absl::NotFoundError(absl::StrCat(path, ": open: No such file"));
  }
  return it->second->data;
}

absl::Status FaultFileSystem::Rename(const std::string& from,
                                     const std::string& to) {
  absl::MutexLock lock(&mu_);
  if (fail_rename_) {
    return absl::InternalError(
        absl::StrCat(to, ": rename: the process died before it"));
  }
  auto it = files_.find(from);
  if (it == files_.end()) {
    return absl::NotFoundError(absl::StrCat(from, ": rename: No such file"));
  }
  files_[to] = it->second;
  files_.erase(from);
  return absl::OkStatus();
}

absl::Status FaultFileSystem::Delete(const std::string& path) {
  absl::MutexLock lock(&mu_);
  if (files_.erase(path) == 0) {
    return absl::NotFoundError(absl::StrCat(path, ": unlink: No such file"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> FaultFileSystem::ListDir(
    const std::string& dir) {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [path, file] : files_) {
    if (DirOf(path) == dir) names.push_back(path.substr(dir.size() + 1));
  }
  return names;
}

absl::Status FaultFileSystem::SyncDir(const std::string& dir) {
  absl::MutexLock lock(&mu_);
  for (auto it = durable_.begin(); it != durable_.end();) {
    it = DirOf(it->first) == dir ? durable_.erase(it) : std::next(it);
  }
  for (const auto& [path, file] : files_) {
    if (DirOf(path) == dir) durable_[path] = file;
  }
  return absl::OkStatus();
}

void FaultFileSystem::SetSpaceLeft(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  space_left_ = bytes;
}

void FaultFileSystem::SetFailSync(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_sync_ = fail;
}

void FaultFileSystem::SetFailRename(bool fail) {
  absl::MutexLock lock(&mu_);
  fail_rename_ = fail;
}

void FaultFileSystem::Crash() {
  absl::MutexLock lock(&mu_);
  files_.clear();
  for (const auto& [path, file] : durable_) {
    auto survivor = std::make_shared<File>();
    survivor->data = file->synced;
    survivor->synced = file->synced;
    files_[path] = survivor;
  }
  durable_ = files_;
}

void FaultFileSystem::WriteFileForTest(const std::string& path,
                                       std::string data) {
  absl::MutexLock lock(&mu_);
  auto file = std::make_shared<File>();
  file->data = std::move(data);
  file->synced = file->data;
  files_[path] = file;
  durable_[path] = file;
}

bool FaultFileSystem::Exists(const std::string& path) {
  absl::MutexLock lock(&mu_);
  return files_.count(path) > 0;
}

std::vector<std::string> FaultFileSystem::Paths() {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> paths;
  for (const auto& [path, file] : files_) paths.push_back(path);
  return paths;
}

}  // namespace asyncps::testing
