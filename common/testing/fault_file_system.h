// FaultFileSystem: an in-memory FileSystem for tests that can fail the way
// disks and machines do: short writes on a full disk, a failing fsync, a
// process that dies between write and rename, and a power cut that loses
// everything not yet made durable (file data not fsync'd, directory entries
// not SyncDir'd). Thread-safe.
#ifndef ASYNCPS_COMMON_TESTING_FAULT_FILE_SYSTEM_H_
#define ASYNCPS_COMMON_TESTING_FAULT_FILE_SYSTEM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/file_system.h"

namespace asyncps::testing {

class FaultFileSystem final : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override;
  absl::StatusOr<std::string> ReadFile(const std::string& path) override;
  absl::Status Rename(const std::string& from, const std::string& to) override;
  absl::Status Delete(const std::string& path) override;
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override;
  absl::Status SyncDir(const std::string& dir) override;

  // Faults. Each stays in force until changed.
  // Appends past this many more bytes write what fits and fail with
  // RESOURCE_EXHAUSTED (a full disk); negative: unlimited.
  void SetSpaceLeft(int64_t bytes);
  // Sync fails with INTERNAL (an I/O error on fsync).
  void SetFailSync(bool fail);
  // Rename fails and nothing is renamed: the process died just before it.
  void SetFailRename(bool fail);

  // A power cut: every file loses what was not fsync'd, and every directory
  // the entries created, renamed or deleted since its last SyncDir.
  void Crash();

  // Direct access for tests, bypassing faults.
  void WriteFileForTest(const std::string& path, std::string data);
  bool Exists(const std::string& path);
  // Every path, sorted.
  std::vector<std::string> Paths();

 private:
  struct File {
    std::string data;
    std::string synced;
  };
  class Writer;
  absl::Status Append(File* file, absl::string_view data,
                      const std::string& path);
  absl::Status Sync(File* file, const std::string& path);

  absl::Mutex mu_;
  std::map<std::string, std::shared_ptr<File>> files_ ABSL_GUARDED_BY(mu_);
  // The entries a power cut leaves.
  std::map<std::string, std::shared_ptr<File>> durable_ ABSL_GUARDED_BY(mu_);
  int64_t space_left_ ABSL_GUARDED_BY(mu_) = -1;
  bool fail_sync_ ABSL_GUARDED_BY(mu_) = false;
  bool fail_rename_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace asyncps::testing

#endif  // ASYNCPS_COMMON_TESTING_FAULT_FILE_SYSTEM_H_
