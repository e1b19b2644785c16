// Files for tests, with std::filesystem rather than a shell: runfiles, paths
// under Bazel's TEST_TMPDIR (/tmp outside Bazel), fresh directories, and the
// files a test writes (plain or gzip).
#ifndef ASYNCPS_TESTS_TESTING_TEMP_DIR_H_
#define ASYNCPS_TESTS_TESTING_TEMP_DIR_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace asyncps::testing {

// The path of a file in this test's runfiles, e.g. "server/ps_server".
std::string RunfilePath(absl::string_view path);

// TEST_TMPDIR/<name> (nothing made).
std::string TempPath(absl::string_view name);

// TEST_TMPDIR/<name> as an empty directory: removed first if it was there.
std::string FreshTempDir(absl::string_view name);

// A path under TEST_TMPDIR no other call in this process (nor another test
// process) gets: "<prefix>-<pid>-<n><suffix>", nothing there.
std::string UniqueTempPath(absl::string_view prefix, absl::string_view suffix);

// The bytes of `path`, or nullopt if it cannot be opened.
std::optional<std::string> ReadFile(const std::string& path);

// Writes `bytes` to `path` (replacing it); false if it could not.
bool WriteFile(const std::string& path, absl::string_view bytes);
// The same, gzip-compressed (zlib).
bool WriteGzFile(const std::string& path, absl::string_view bytes);

// The regular files in `dir` whose names start with `prefix` and end with
// `suffix`, as full paths, sorted.
std::vector<std::string> ListFiles(const std::string& dir,
                                   absl::string_view prefix,
                                   absl::string_view suffix);

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_TESTING_TEMP_DIR_H_
