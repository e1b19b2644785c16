// NpzWriter: writes numpy's .npz format (a zip archive of .npy arrays,
// stored without compression, as numpy.savez does) so a model's tensors
// load with numpy.load(FILE)[name]. float32, C order. Thread-compatible.
#ifndef ASYNCPS_TOOLS_NPZ_WRITER_H_
#define ASYNCPS_TOOLS_NPZ_WRITER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace asyncps {

class NpzWriter {
 public:
  // Adds array `name` (stored as "name.npy") of `shape` holding `values`.
  // INVALID_ARGUMENT if the shape does not hold values.size() elements, the
  // name is empty or already added, or the archive would pass 4 GiB (no
  // zip64 here).
  absl::Status Add(const std::string& name, const std::vector<int64_t>& shape,
                   absl::Span<const float> values);
  // The whole archive.
  std::string Finish() const;

 private:
  struct Entry {
    std::string name;  // In the archive.
    uint32_t crc = 0;
    uint32_t size = 0;
    uint32_t offset = 0;  // Of its local header.
  };
  std::vector<Entry> entries_;
  std::string body_;  // Local headers and data so far.
};

// The .npy bytes (format 1.0) of a float32 array of `shape`.
std::string NpyBytes(const std::vector<int64_t>& shape,
                     absl::Span<const float> values);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_NPZ_WRITER_H_
