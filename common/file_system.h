// The file-system seam: checkpoint code reads and writes files only through a
// FileSystem, so tests can run it in memory and inject faults (short writes,
// a full disk, a failed fsync, a crash between write and rename), as
// LevelDB's Env does.
#ifndef ASYNCPS_COMMON_FILE_SYSTEM_H_
#define ASYNCPS_COMMON_FILE_SYSTEM_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace asyncps {

// A file being written. Not thread-safe; close it before reading the file.
class WritableFile {
 public:
  virtual ~WritableFile() = default;
  // Appends all of `data`, or fails (then part of it may have been written).
  virtual absl::Status Append(absl::string_view data) = 0;
  // Makes what was appended durable (fsync).
  virtual absl::Status Sync() = 0;
  virtual absl::Status Close() = 0;
};

// A file being read from its start (a checkpoint, chunk by chunk, so a big
// one never sits in memory whole). Not thread-safe.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Appends up to `n` bytes to `*out`: fewer only at the end of the file
  // (none once there).
  virtual absl::Status Read(size_t n, std::string* out) = 0;
};

// Thread-safe. Every error's message names the path and the operation.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Creates or truncates `path`.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // The whole file; NOT_FOUND if it does not exist.
  virtual absl::StatusOr<std::string> ReadFile(const std::string& path) = 0;
  // `path` to read from its start; NOT_FOUND if it does not exist. This
  // default reads the whole file first (in-memory doubles need no more).
  virtual absl::StatusOr<std::unique_ptr<SequentialFile>> NewSequentialFile(
      const std::string& path);
  // The size of `path` in bytes; NOT_FOUND if it does not exist. This
  // default reads the whole file (in-memory doubles need no more).
  virtual absl::StatusOr<uint64_t> FileSize(const std::string& path);
  // Atomically replaces `to` with `from`.
  virtual absl::Status Rename(const std::string& from,
                              const std::string& to) = 0;
  virtual absl::Status Delete(const std::string& path) = 0;
  // The names (not paths) of the entries of `dir`; NOT_FOUND if it is missing.
  virtual absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) = 0;
  // Makes the entries of `dir` (creations, renames) durable.
  virtual absl::Status SyncDir(const std::string& dir) = 0;

  // The operating system's file system; never destroyed.
  static FileSystem* Default();
};

// Writes `contents` to `path` whole or not at all: into `path`.tmp, then
// renamed over `path` (a reader never sees a partial file). The error names
// the path.
absl::Status WriteFileAtomically(FileSystem* fs, const std::string& path,
                                 absl::string_view contents);

}  // namespace asyncps

#endif  // ASYNCPS_COMMON_FILE_SYSTEM_H_
