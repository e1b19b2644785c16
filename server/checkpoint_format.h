// The checkpoint file format. Format 2 (written since issue #38, 8):
//
//   header   "ASYNCPSC" | u32 format = 2 | u32 0
//   records  u32 kind | u64 length | u32 CRC-32 of the bytes | the bytes
//            kind "CHNK": a v1::CheckpointChunk (server/checkpoint_stream.h)
//            kind "TAIL": the last record, 20 bytes: u64 chunks |
//                         u64 bytes of every chunk | u32 CRC-32 of them all
//
// little-endian, so a shard of any size is written and read one bounded
// chunk at a time. Format 1 (a header with a u64 length and a CRC-32, then
// one v1::ShardCheckpoint) is still read, if it is under 2 GiB.
#ifndef ASYNCPS_SERVER_CHECKPOINT_FORMAT_H_
#define ASYNCPS_SERVER_CHECKPOINT_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "absl/status/status.h"
#include "common/file_system.h"
#include "server/checkpoint_stream.h"

namespace asyncps {

// Writes `path` through a temporary file (write, fsync, rename, fsync the
// directory) with what `produce` gives the sink it is called with, in
// chunks of `chunk_bytes`. On error the temporary file is removed (as far
// as `fs` lets) and `path` is untouched. `*bytes`, if given, becomes the
// file's size.
using CheckpointProducer = std::function<absl::Status(CheckpointSink*)>;
absl::Status WriteChunkedFile(FileSystem* fs, const std::string& path,
                              const CheckpointProducer& produce,
                              size_t chunk_bytes, uint64_t* bytes = nullptr);

// Reads `path` into `sink`, calling its Finish only once the whole file
// checked out. DATA_LOSS naming the file and the problem (bad magic,
// unknown format, truncated, a chunk's or the whole checksum mismatch,
// unparsable), NOT_FOUND if it is missing; the sink's own errors as they
// are. Memory: a chunk at a time (format 1: the whole file).
// `progress`, if given, is called with the bytes read so far after each
// read from the file (a chunk or less at a time).
using ReadProgress = std::function<void(uint64_t bytes)>;
absl::Status ReadChunkedFile(FileSystem* fs, const std::string& path,
                             CheckpointSink* sink,
                             const ReadProgress& progress = nullptr);

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_FORMAT_H_
