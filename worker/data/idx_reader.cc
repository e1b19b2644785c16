#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {
namespace {

constexpr uint32_t kImagesMagic = 0x00000803;  // ubyte, 3 dimensions.
constexpr uint32_t kLabelsMagic = 0x00000801;  // ubyte, 1 dimension.
constexpr int64_t kMaxExamples = 100'000'000;
constexpr int64_t kMaxSide = 4096;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};
using GzFile = std::unique_ptr<gzFile_s, GzCloser>;

// Reads exactly n bytes or fails naming `path` and `what`.
absl::Status ReadExactly(gzFile f, const std::string& path, void* dst, size_t n,
                         absl::string_view what) {
  size_t got = 0;
  auto* out = static_cast<char*>(dst);
  while (got < n) {
    const unsigned chunk =
        static_cast<unsigned>(std::min<size_t>(n - got, 1u << 30));
    const int r = gzread(f, out + got, chunk);
    if (r < 0) {
      int errnum = 0;
      const char* msg = gzerror(f, &errnum);
      return absl::DataLossError(absl::StrCat(path, ": corrupt gzip data (",
                                              msg, ") while reading ", what));
    }
    if (r == 0) {
      return absl::DataLossError(absl::StrCat(
          path, ": truncated: ", what, " needs ", n, " bytes, file has ", got));
    }
    got += r;
  }
  return absl::OkStatus();
}

// Reads exactly n bytes into *out, growing it only as the bytes arrive: a
// header that claims more than the file holds (a hostile or truncated
// file) fails as truncated instead of allocating what it claims first.
absl::Status ReadGrowing(gzFile f, const std::string& path, uint64_t n,
                         absl::string_view what, std::vector<uint8_t>* out) {
  constexpr uint64_t kChunk = uint64_t{64} << 20;
  out->clear();
  while (out->size() < n) {
    const uint64_t chunk = std::min<uint64_t>(n - out->size(), kChunk);
    const size_t at = out->size();
    out->resize(at + chunk);
    absl::Status s = ReadExactly(f, path, out->data() + at, chunk, what);
    if (!s.ok()) {
      return absl::DataLossError(absl::StrCat(path, ": truncated: ", what,
                                              " needs ", n,
                                              " bytes, the file ends before"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> ReadBigEndian32(gzFile f, const std::string& path,
                                         absl::string_view what) {
  unsigned char b[4];
  RETURN_IF_ERROR(ReadExactly(f, path, b, 4, what));
  return (uint32_t{b[0]} << 24) | (uint32_t{b[1]} << 16) |
         (uint32_t{b[2]} << 8) | uint32_t{b[3]};
}

absl::StatusOr<GzFile> Open(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  }
  return GzFile(f);
}

absl::Status CheckMagic(uint32_t magic, uint32_t want,
                        const std::string& path) {
  if (magic == want) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      path, ": bad magic number 0x", absl::Hex(magic, absl::kZeroPad8),
      " (want 0x", absl::Hex(want, absl::kZeroPad8), ")"));
}

}  // namespace

absl::StatusOr<Dataset> ReadIdxPair(const std::string& images_path,
                                    const std::string& labels_path,
                                    int num_classes) {
  Dataset d;
  {
    ASSIGN_OR_RETURN(auto f, Open(images_path));
    gzFile g = f.get();
    ASSIGN_OR_RETURN(const uint32_t magic,
                     ReadBigEndian32(g, images_path, "the magic number"));
    RETURN_IF_ERROR(CheckMagic(magic, kImagesMagic, images_path));
    auto n = ReadBigEndian32(g, images_path, "the image count");
    auto rows = ReadBigEndian32(g, images_path, "the row count");
    auto cols = ReadBigEndian32(g, images_path, "the column count");
    for (const auto* v : {&n, &rows, &cols}) {
      if (!v->ok()) return v->status();
    }
    if (*n > kMaxExamples || *rows == 0 || *cols == 0 || *rows > kMaxSide ||
        *cols > kMaxSide) {
      return absl::InvalidArgumentError(
          absl::StrCat(images_path, ": implausible header: ", *n, " images of ",
                       *rows, "x", *cols));
    }
    d.size = *n;
    d.features = int64_t{*rows} * *cols;
    std::vector<uint8_t> raw;
    RETURN_IF_ERROR(
        ReadGrowing(g, images_path, static_cast<uint64_t>(d.size * d.features),
                    absl::StrCat(*n, " images of ", *rows, "x", *cols), &raw));
    d.pixels.resize(raw.size());
    for (size_t i = 0; i < raw.size(); ++i) d.pixels[i] = raw[i] / 255.0f;
  }
  {
    ASSIGN_OR_RETURN(auto f, Open(labels_path));
    gzFile g = f.get();
    ASSIGN_OR_RETURN(const uint32_t magic,
                     ReadBigEndian32(g, labels_path, "the magic number"));
    RETURN_IF_ERROR(CheckMagic(magic, kLabelsMagic, labels_path));
    ASSIGN_OR_RETURN(const uint32_t n,
                     ReadBigEndian32(g, labels_path, "the label count"));
    if (static_cast<int64_t>(n) != d.size) {
      return absl::InvalidArgumentError(
          absl::StrCat(labels_path, ": wrong count: ", n, " labels for ",
                       d.size, " images in ", images_path));
    }
    d.labels.resize(d.size);
    RETURN_IF_ERROR(ReadExactly(g, labels_path, d.labels.data(),
                                d.labels.size(), absl::StrCat(n, " labels")));
    for (int64_t i = 0; i < d.size; ++i) {
      if (d.labels[i] >= num_classes) {
        return absl::InvalidArgumentError(
            absl::StrCat(labels_path, ": label ", int{d.labels[i]},
                         " of example ", i, " is not below ", num_classes));
      }
    }
  }
  return d;
}

absl::StatusOr<Dataset> ReadFashionMnist(const std::string& dir,
                                         const std::string& split) {
  return ReadIdxPair(absl::StrCat(dir, "/", split, "-images-idx3-ubyte.gz"),
                     absl::StrCat(dir, "/", split, "-labels-idx1-ubyte.gz"));
}

}  // namespace asyncps
