#include "tools/ops/npz_writer.h"

#include <zlib.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace asyncps {
namespace {

void Put16(std::string* out, uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

void Put32(std::string* out, uint32_t v) {
  Put16(out, static_cast<uint16_t>(v & 0xffff));
  Put16(out, static_cast<uint16_t>(v >> 16));
}

constexpr uint64_t kZipLimit = uint64_t{0xffffffff};

}  // namespace

std::string NpyBytes(const std::vector<int64_t>& shape,
                     absl::Span<const float> values) {
  return NpyBytes(shape, "<f4", values.data(), values.size() * sizeof(float));
}

std::string NpyBytes(const std::vector<int64_t>& shape, const char* descr,
                     const void* data, size_t bytes) {
  std::string dims;
  for (int64_t d : shape) absl::StrAppend(&dims, d, ",");
  if (shape.size() > 1) dims.pop_back();  // (a,) for one dimension only.
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': (", dims, "), }");
  // Magic (6), version (2), header length (2), header ending in '\n', the
  // whole a multiple of 64 bytes.
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header.push_back('\n');
  std::string out("\x93NUMPY\x01\x00", 8);
  Put16(&out, static_cast<uint16_t>(header.size()));
  out += header;
  // Little-endian (this machine's order; Debian's amd64 and arm64).
  out.append(static_cast<const char*>(data), bytes);
  return out;
}

absl::Status NpzWriter::Add(const std::string& name,
                            const std::vector<int64_t>& shape,
                            absl::Span<const float> values) {
  return AddArray(name, shape, "<f4", values.data(), values.size(),
                  sizeof(float));
}

absl::Status NpzWriter::Add(const std::string& name,
                            const std::vector<int64_t>& shape,
                            absl::Span<const int64_t> values) {
  return AddArray(name, shape, "<i8", values.data(), values.size(),
                  sizeof(int64_t));
}

absl::Status NpzWriter::AddArray(const std::string& name,
                                 const std::vector<int64_t>& shape,
                                 const char* descr, const void* values,
                                 size_t count, size_t element_bytes) {
  if (name.empty()) return absl::InvalidArgumentError("npz: an empty name");
  uint64_t elements = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("npz: '", name, "' has a negative dimension"));
    }
    elements *= static_cast<uint64_t>(d);
  }
  if (elements != count) {
    return absl::InvalidArgumentError(absl::StrCat(
        "npz: '", name, "' has ", count, " values for a shape of ", elements));
  }
  if (entries_.size() >= 0xffff) {
    return absl::InvalidArgumentError(
        "npz: more than 65,534 arrays needs zip64 (not built)");
  }
  const std::string file = name + ".npy";
  for (const Entry& e : entries_) {
    if (e.name == file) {
      return absl::InvalidArgumentError(
          absl::StrCat("npz: '", name, "' added twice"));
    }
  }
  const std::string data =
      NpyBytes(shape, descr, values, count * element_bytes);
  if (body_.size() + 30 + file.size() + data.size() +
          (entries_.size() + 1) * (46 + file.size()) + 22 >
      kZipLimit) {
    return absl::InvalidArgumentError(
        "npz: the model passes 4 GiB, which needs zip64 (not built)");
  }
  Entry e;
  e.name = file;
  e.crc = static_cast<uint32_t>(
      crc32(0L, reinterpret_cast<const Bytef*>(data.data()),
            static_cast<uInt>(data.size())));
  e.size = static_cast<uint32_t>(data.size());
  e.offset = static_cast<uint32_t>(body_.size());
  Put32(&body_, 0x04034b50);  // Local file header.
  Put16(&body_, 20);          // Version needed: 2.0.
  Put16(&body_, 0);           // Flags.
  Put16(&body_, 0);           // Stored.
  Put16(&body_, 0);           // Time.
  Put16(&body_, 0x21);        // Date: 1980-01-01.
  Put32(&body_, e.crc);
  Put32(&body_, e.size);
  Put32(&body_, e.size);
  Put16(&body_, static_cast<uint16_t>(file.size()));
  Put16(&body_, 0);  // Extra.
  body_ += file;
  body_ += data;
  entries_.push_back(std::move(e));
  return absl::OkStatus();
}

std::string NpzWriter::Finish() const {
  std::string out = body_;
  const uint32_t directory = static_cast<uint32_t>(out.size());
  for (const Entry& e : entries_) {
    Put32(&out, 0x02014b50);  // Central directory header.
    Put16(&out, 20);          // Made by.
    Put16(&out, 20);          // Needed.
    Put16(&out, 0);
    Put16(&out, 0);
    Put16(&out, 0);
    Put16(&out, 0x21);
    Put32(&out, e.crc);
    Put32(&out, e.size);
    Put32(&out, e.size);
    Put16(&out, static_cast<uint16_t>(e.name.size()));
    Put16(&out, 0);  // Extra.
    Put16(&out, 0);  // Comment.
    Put16(&out, 0);  // Disk.
    Put16(&out, 0);  // Internal attributes.
    Put32(&out, 0);  // External attributes.
    Put32(&out, e.offset);
    out += e.name;
  }
  const uint32_t size = static_cast<uint32_t>(out.size()) - directory;
  Put32(&out, 0x06054b50);  // End of central directory.
  Put16(&out, 0);
  Put16(&out, 0);
  Put16(&out, static_cast<uint16_t>(entries_.size()));
  Put16(&out, static_cast<uint16_t>(entries_.size()));
  Put32(&out, size);
  Put32(&out, directory);
  Put16(&out, 0);
  return out;
}

}  // namespace asyncps
