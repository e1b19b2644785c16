// libFuzzer target: bytes as a pair of IDX files (images, labels), split
// where the first byte says, read as a worker reads Fashion-MNIST (gzip'd
// or not). Any input must give a data set or an error.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "worker/data/idx_reader.h"

namespace {

void Write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(data),
             static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t split = std::min<size_t>(size - 1, data[0] * 4);
  static const std::string dir =
      "/tmp/asyncps-idx-fuzz-" + std::to_string(getpid());
  static const bool made = std::filesystem::create_directories(dir);
  (void)made;
  Write(dir + "/images", data + 1, split);
  Write(dir + "/labels", data + 1 + split, size - 1 - split);
  (void)asyncps::ReadIdxPair(dir + "/images", dir + "/labels");
  return 0;
}
