// NpzWriter: writes numpy's .npz format (a zip archive of .npy arrays,
// stored without compression, as numpy.savez does) so a model's tensors
// load with numpy.load(FILE)[name]. float32, C order. Thread-compatible.
#ifndef ASYNCPS_TOOLS_OPS_NPZ_WRITER_H_
#define ASYNCPS_TOOLS_OPS_NPZ_WRITER_H_

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
  // The same for an int64 array (e.g. an embedding table's ids).
  absl::Status Add(const std::string& name, const std::vector<int64_t>& shape,
                   absl::Span<const int64_t> values);
  // The whole archive.
  std::string Finish() const;

 private:
  // `count` elements of `element_bytes` each, of numpy dtype `descr`.
  absl::Status AddArray(const std::string& name,
                        const std::vector<int64_t>& shape, const char* descr,
                        const void* values, size_t count, size_t element_bytes);

  struct Entry {
    std::string name;  // In the archive.
    uint32_t crc = 0;
    uint32_t size = 0;
    uint32_t offset = 0;  // Of its local header.
  };
  std::vector<Entry> entries_;
  std::string body_;  // Local headers and data so far.
};

// The .npy bytes (format 1.0) of a float32 array of `shape`, and of
// `bytes` of any numpy dtype `descr` ("<f4", "<i8").
std::string NpyBytes(const std::vector<int64_t>& shape,
                     absl::Span<const float> values);
std::string NpyBytes(const std::vector<int64_t>& shape, const char* descr,
                     const void* data, size_t bytes);

}  // namespace asyncps

#endif  // ASYNCPS_TOOLS_OPS_NPZ_WRITER_H_
