// A shard's checkpoint as a stream of bounded chunks (v1::CheckpointChunk),
// so that neither a checkpoint file (server/checkpoint_format.h) nor a
// replica's snapshot (server/replication.h) ever holds the whole shard
// serialized, nor hits protobuf's 2 GiB limit. A producer (ShardStore::
// Snapshot, EmbeddingTable saves) calls a CheckpointSink with one piece at a
// time; ChunkEncoder is the sink that cuts them into chunks, ChunkDecoder
// puts chunks back together into the pieces for another sink. Neither class
// is thread-safe.
#ifndef ASYNCPS_SERVER_CHECKPOINT_STREAM_H_
#define ASYNCPS_SERVER_CHECKPOINT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/checkpoint.pb.h"

namespace asyncps {

// How much of the slices' and tables' bytes one chunk carries.
inline constexpr size_t kCheckpointChunkBytes = size_t{4} << 20;
// The most a reader accepts for one chunk, whatever the writer's chunk size
// (a chunk also carries a slice's or the spec's other fields).
inline constexpr uint64_t kMaxChunkBytes = uint64_t{256} << 20;

// zlib's CRC-32 of `data` continuing `crc`, for any length.
uint32_t Crc32(uint32_t crc, absl::string_view data);

// Receives a checkpoint piece by piece: Head once, then the slices and
// tables in any order, then Finish once all arrived (and were checked).
// Any error ends the stream.
class CheckpointSink {
 public:
  virtual ~CheckpointSink() = default;
  // The spec (if a model is declared), shard and time; no slices, no tables.
  virtual absl::Status Head(const v1::ShardCheckpoint& head) = 0;
  // The sink may take the contents.
  virtual absl::Status Slice(v1::SliceCheckpoint* slice) = 0;
  virtual absl::Status Table(v1::EmbeddingCheckpoint* table) = 0;
  virtual absl::Status Finish() = 0;
};

// Calls `sink` with every piece of `checkpoint` (not Finish: producers
// leave that to whoever ends the stream).
absl::Status FeedCheckpoint(const v1::ShardCheckpoint& checkpoint,
                            CheckpointSink* sink);

// A sink that puts the whole checkpoint together (small ones: tests, tools,
// and callers that want a v1::ShardCheckpoint).
class CheckpointCollector final : public CheckpointSink {
 public:
  absl::Status Head(const v1::ShardCheckpoint& head) override;
  absl::Status Slice(v1::SliceCheckpoint* slice) override;
  absl::Status Table(v1::EmbeddingCheckpoint* table) override;
  absl::Status Finish() override { return absl::OkStatus(); }
  v1::ShardCheckpoint& checkpoint() { return checkpoint_; }

 private:
  v1::ShardCheckpoint checkpoint_;
};

// Cuts what it is given into serialized chunks of at most `chunk_bytes` of
// the slices' and tables' bytes each, handing each to `out` as soon as it
// is full: it keeps one chunk at a time. Finish flushes the last one.
class ChunkEncoder final : public CheckpointSink {
 public:
  // Gets each chunk with its CRC-32.
  using Output = std::function<absl::Status(std::string chunk, uint32_t crc)>;
  // REQUIRES: 0 < chunk_bytes <= kMaxChunkBytes / 2.
  ChunkEncoder(size_t chunk_bytes, Output out);

  absl::Status Head(const v1::ShardCheckpoint& head) override;
  absl::Status Slice(v1::SliceCheckpoint* slice) override;
  absl::Status Table(v1::EmbeddingCheckpoint* table) override;
  absl::Status Finish() override { return absl::OkStatus(); }

  // What went to `out` so far: chunks, their bytes, the CRC-32 of them all.
  uint64_t chunks() const { return chunks_; }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc() const { return crc_; }

 private:
  absl::Status Emit(const v1::CheckpointChunk& chunk);
  // Cuts `item` (its bytes fields `fields`) over as many chunks as needed;
  // `part` is where a chunk keeps its copy of the item.
  template <typename Item>
  absl::Status Cut(Item* item, Item* (*part)(v1::CheckpointChunk*));

  const size_t chunk_bytes_;
  const Output out_;
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

// Parses chunks (each already checked against its own checksum) and hands
// the pieces they make up to `sink`: an item cut over several chunks goes
// to it once whole. A chunk that does not parse, or comes out of order
// (nothing before the head, a second head, a continuation of nothing),
// is DATA_LOSS naming its index.
class ChunkDecoder {
 public:
  // `sink` is borrowed and must outlive this.
  explicit ChunkDecoder(CheckpointSink* sink) : sink_(sink) {}
  absl::Status Add(absl::string_view chunk);
  // Hands over the last item, then calls the sink's Finish. DATA_LOSS if
  // there was no head.
  absl::Status Finish();
  uint64_t chunks() const { return chunks_; }

 private:
  absl::Status Flush();
  absl::Status Loss(absl::string_view why) const;

  CheckpointSink* const sink_;
  uint64_t chunks_ = 0;
  bool head_ = false;
  // The item being put together, if any.
  std::optional<v1::CheckpointChunk> item_;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_STREAM_H_
