#include "server/checkpoint_format.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/checkpoint.pb.h"

namespace asyncps {
namespace {

constexpr char kMagic[8] = {'A', 'S', 'Y', 'N', 'C', 'P', 'S', 'C'};
constexpr uint32_t kFormat1 = 1;
constexpr uint32_t kFormat2 = 2;
// Kinds of record, as their four bytes read little-endian.
constexpr uint32_t kChunkRecord = 0x4B4E4843;  // "CHNK"
constexpr uint32_t kTailRecord = 0x4C494154;   // "TAIL"
constexpr size_t kRecordHeaderBytes = 4 + 8 + 4;
constexpr size_t kTailBytes = 8 + 8 + 4;
// A file is read in steps of at most this: a length read from a damaged
// file allocates no more than this beyond what the file really holds.
constexpr size_t kReadStep = size_t{16} << 20;

void PutLe(std::string* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out->push_back(static_cast<char>(v >> (8 * i)));
}

uint64_t GetLe(const char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  return v;
}

std::string DirOf(const std::string& path) {
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

std::string Record(uint32_t kind, uint64_t length, uint32_t crc) {
  std::string r;
  r.reserve(kRecordHeaderBytes);
  PutLe(&r, kind, 4);
  PutLe(&r, length, 8);
  PutLe(&r, crc, 4);
  return r;
}

absl::Status WriteRecords(FileSystem* fs, const std::string& tmp,
                          const CheckpointProducer& produce, size_t chunk_bytes,
                          uint64_t* written) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                   fs->NewWritableFile(tmp));
  std::string header(kMagic, sizeof(kMagic));
  PutLe(&header, kFormat2, 4);
  PutLe(&header, 0, 4);
  RETURN_IF_ERROR(file->Append(header));
  *written = header.size();
  ChunkEncoder encoder(chunk_bytes, [&](std::string chunk, uint32_t crc) {
    RETURN_IF_ERROR(file->Append(Record(kChunkRecord, chunk.size(), crc)));
    *written += kRecordHeaderBytes + chunk.size();
    return file->Append(chunk);
  });
  RETURN_IF_ERROR(produce(&encoder));
  RETURN_IF_ERROR(encoder.Finish());
  std::string tail;
  PutLe(&tail, encoder.chunks(), 8);
  PutLe(&tail, encoder.bytes(), 8);
  PutLe(&tail, encoder.crc(), 4);
  RETURN_IF_ERROR(
      file->Append(Record(kTailRecord, tail.size(), Crc32(0, tail)) + tail));
  *written += kRecordHeaderBytes + tail.size();
  RETURN_IF_ERROR(file->Sync());
  return file->Close();
}

// A file that says how much has been read of it.
class CountingFile final : public SequentialFile {
 public:
  CountingFile(SequentialFile* file, const ReadProgress& progress)
      : file_(file), progress_(progress) {}
  absl::Status Read(size_t n, std::string* out) override {
    const size_t before = out->size();
    RETURN_IF_ERROR(file_->Read(n, out));
    bytes_ += out->size() - before;
    progress_(bytes_);
    return absl::OkStatus();
  }

 private:
  SequentialFile* const file_;
  const ReadProgress& progress_;
  uint64_t bytes_ = 0;
};

// Reads a format-2 or format-1 file into a sink, with the file's path in
// every error.
class Reader {
 public:
  Reader(std::string path, SequentialFile* file, CheckpointSink* sink)
      : path_(std::move(path)), file_(file), sink_(sink) {}

  absl::Status Read() {
    std::string header;
    RETURN_IF_ERROR(ReadUpTo(12, &header));
    if (header.size() < 12) return Loss("truncated header");
    if (std::memcmp(header.data(), kMagic, sizeof(kMagic)) != 0) {
      return Loss("bad magic: not an asyncps checkpoint");
    }
    const uint64_t format = GetLe(header.data() + 8, 4);
    if (format == kFormat1) return ReadFormat1();
    if (format != kFormat2) {
      return Loss(absl::StrCat("unknown format version ", format));
    }
    header.clear();
    RETURN_IF_ERROR(ReadUpTo(4, &header));
    if (header.size() < 4) return Loss("truncated header");
    return ReadFormat2();
  }

 private:
  absl::Status Loss(absl::string_view why) const {
    return absl::DataLossError(absl::StrCat(path_, ": ", why));
  }

  // Appends up to `n` bytes (fewer only at the end of the file) to `out`.
  absl::Status ReadUpTo(uint64_t n, std::string* out) {
    while (n > 0) {
      const size_t before = out->size();
      const size_t step = static_cast<size_t>(std::min<uint64_t>(n, kReadStep));
      RETURN_IF_ERROR(file_->Read(step, out));
      const size_t got = out->size() - before;
      n -= got;
      if (got < step) break;
    }
    return absl::OkStatus();
  }

  absl::Status AtEnd() {
    std::string more;
    RETURN_IF_ERROR(ReadUpTo(1, &more));
    if (!more.empty()) return Loss("bytes after the trailer");
    return absl::OkStatus();
  }

  absl::Status ReadFormat2() {
    ChunkDecoder decoder(sink_);
    uint64_t chunks = 0, bytes = 0;
    uint32_t crc = 0;
    while (true) {
      std::string head;
      RETURN_IF_ERROR(ReadUpTo(kRecordHeaderBytes, &head));
      if (head.size() < kRecordHeaderBytes) {
        return Loss(
            absl::StrCat("truncated after ", chunks, " chunks: no trailer"));
      }
      const uint64_t kind = GetLe(head.data(), 4);
      const uint64_t length = GetLe(head.data() + 4, 8);
      const uint64_t want = GetLe(head.data() + 12, 4);
      if (kind != kChunkRecord && kind != kTailRecord) {
        return Loss(
            absl::StrCat("record ", chunks, " is of unknown kind ", kind));
      }
      const bool tail = kind == kTailRecord;
      if (tail ? length != kTailBytes : length > kMaxChunkBytes) {
        return Loss(absl::StrCat(tail ? "trailer" : "chunk ",
                                 tail ? "" : absl::StrCat(chunks), " claims ",
                                 length, " bytes"));
      }
      std::string body;
      RETURN_IF_ERROR(ReadUpTo(length, &body));
      if (body.size() < length) {
        return Loss(
            absl::StrCat("truncated in ",
                         tail ? "the trailer" : absl::StrCat("chunk ", chunks),
                         ": ", body.size(), " of ", length, " bytes"));
      }
      if (Crc32(0, body) != want) {
        return Loss(tail ? "checksum mismatch in the trailer"
                         : absl::StrCat("checksum mismatch in chunk ", chunks));
      }
      if (tail) {
        if (GetLe(body.data(), 8) != chunks ||
            GetLe(body.data() + 8, 8) != bytes) {
          return Loss(absl::StrCat("the trailer counts ", GetLe(body.data(), 8),
                                   " chunks of ", GetLe(body.data() + 8, 8),
                                   " bytes; the file has ", chunks, " of ",
                                   bytes));
        }
        if (GetLe(body.data() + 16, 4) != crc) {
          return Loss("whole-file checksum mismatch");
        }
        RETURN_IF_ERROR(AtEnd());
        return Annotated(decoder.Finish());
      }
      ++chunks;
      bytes += length;
      crc = static_cast<uint32_t>(crc32_combine(
          crc, static_cast<uint32_t>(want), static_cast<z_off_t>(length)));
      RETURN_IF_ERROR(Annotated(decoder.Add(body)));
    }
  }

  absl::Status ReadFormat1() {
    std::string header;
    RETURN_IF_ERROR(ReadUpTo(12, &header));
    if (header.size() < 12) return Loss("truncated header");
    const uint64_t length = GetLe(header.data(), 8);
    const uint64_t want = GetLe(header.data() + 8, 4);
    std::string payload;
    RETURN_IF_ERROR(ReadUpTo(length, &payload));
    if (payload.size() != length) {
      return Loss(absl::StrCat("truncated: header says ", length,
                               " payload bytes, file has ", payload.size()));
    }
    RETURN_IF_ERROR(AtEnd());
    if (Crc32(0, payload) != want) return Loss("checksum mismatch");
    v1::ShardCheckpoint checkpoint;
    if (length > INT32_MAX ||
        !checkpoint.ParseFromArray(payload.data(), static_cast<int>(length))) {
      return Loss("payload does not parse");
    }
    std::string().swap(payload);
    RETURN_IF_ERROR(Annotated(FeedCheckpoint(checkpoint, sink_)));
    return Annotated(sink_->Finish());
  }

  // A sink's or decoder's error, with the path if it is about the data.
  absl::Status Annotated(absl::Status s) const {
    if (s.ok() || s.code() != absl::StatusCode::kDataLoss) return s;
    return Loss(s.message());
  }

  const std::string path_;
  SequentialFile* const file_;
  CheckpointSink* const sink_;
};

}  // namespace

absl::Status WriteChunkedFile(FileSystem* fs, const std::string& path,
                              const CheckpointProducer& produce,
                              size_t chunk_bytes, uint64_t* bytes) {
  const std::string tmp = path + ".tmp";
  uint64_t written = 0;
  absl::Status s = WriteRecords(fs, tmp, produce, chunk_bytes, &written);
  if (s.ok()) s = fs->Rename(tmp, path);
  if (!s.ok()) {
    fs->Delete(tmp).IgnoreError();  // It may not exist.
    return s;
  }
  // The rename is in place; a failed directory fsync only risks losing
  // this newest file at a power cut, which the older ones survive.
  fs->SyncDir(DirOf(path)).IgnoreError();
  if (bytes != nullptr) *bytes = written;
  return absl::OkStatus();
}

absl::Status ReadChunkedFile(FileSystem* fs, const std::string& path,
                             CheckpointSink* sink,
                             const ReadProgress& progress) {
  ASSIGN_OR_RETURN(std::unique_ptr<SequentialFile> file,
                   fs->NewSequentialFile(path));
  if (!progress) return Reader(path, file.get(), sink).Read();
  CountingFile counted(file.get(), progress);
  return Reader(path, &counted, sink).Read();
}

}  // namespace asyncps
