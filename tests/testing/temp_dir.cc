#include "tests/testing/temp_dir.h"

#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace asyncps::testing {

std::string RunfilePath(absl::string_view path) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return std::string(path);
  return absl::StrCat(srcdir, "/", workspace ? workspace : "asyncps", "/",
                      path);
}

std::string TempPath(absl::string_view name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string FreshTempDir(absl::string_view name) {
  const std::string dir = TempPath(name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

std::string UniqueTempPath(absl::string_view prefix, absl::string_view suffix) {
  static std::atomic<int> made{0};
  const std::string path = TempPath(
      absl::StrCat(prefix, "-", getpid(), "-", made.fetch_add(1), suffix));
  std::filesystem::remove(path);
  return path;
}

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

bool WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return out.good();
}

bool WriteGzFile(const std::string& path, absl::string_view bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  if (f == nullptr) return false;
  const bool wrote =
      bytes.empty() ||
      gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())) > 0;
  return (gzclose(f) == Z_OK) && wrote;
}

std::vector<std::string> ListFiles(const std::string& dir,
                                   absl::string_view prefix,
                                   absl::string_view suffix) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && absl::StartsWith(name, prefix) &&
        absl::EndsWith(name, suffix)) {
      out.push_back(entry.path().string());
    }
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace asyncps::testing
