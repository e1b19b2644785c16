// libFuzzer target: bytes as a pair of IDX files (images, labels), split
// where the first byte says, read as a worker reads Fashion-MNIST (gzip'd
// or not). Any input must give a data set or an error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/data/idx_reader.h"

namespace {

// The files a run reads, in a directory of this process's, removed when
// the fuzzer exits (libFuzzer ends with exit(), which runs this).
struct Scratch {
  Scratch() {
    const char* tmp = std::getenv("TMPDIR");
    dir = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") +
          "/asyncps-idx-fuzz-" + std::to_string(getpid());
    std::filesystem::create_directories(dir);
  }
  ~Scratch() {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  std::string dir;
};

void Write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data),
             static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t split = std::min<size_t>(size - 1, data[0] * 4);
  static Scratch scratch;
  const std::string& dir = scratch.dir;
  Write(dir + "/images", data + 1, split);
  Write(dir + "/labels", data + 1 + split, size - 1 - split);
  (void)asyncps::ReadIdxPair(dir + "/images", dir + "/labels");
  return 0;
}
