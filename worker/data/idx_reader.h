// Reads the IDX files of MNIST-style data sets (Fashion-MNIST as Debian's
// dataset-fashion-mnist installs it), gzip'd or not, through zlib.
#ifndef ASYNCPS_WORKER_DATA_IDX_READER_H_
#define ASYNCPS_WORKER_DATA_IDX_READER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace asyncps {

// Images with their labels. Pixels are scaled to [0, 1], row-major,
// `features` per example.
struct Dataset {
  int64_t size = 0;
  int64_t features = 0;  // rows * cols.
  std::vector<float> pixels;
  std::vector<uint8_t> labels;
};

// Reads an images file (magic 0x00000803) and a labels file (0x00000801).
// Errors name the file and the problem: missing, bad magic number, truncated,
// a label >= num_classes, or the two files holding different counts.
absl::StatusOr<Dataset> ReadIdxPair(const std::string& images_path,
                                    const std::string& labels_path,
                                    int num_classes = 10);

// "train" or "t10k" set from a Fashion-MNIST directory.
absl::StatusOr<Dataset> ReadFashionMnist(const std::string& dir,
                                         const std::string& split);

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_DATA_IDX_READER_H_
