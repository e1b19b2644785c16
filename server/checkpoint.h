// Shard checkpoints on disk. A file is a header, the shard's state as
// bounded chunks, each with its length and CRC-32, and a trailer with the
// count and the CRC-32 of them all (server/checkpoint_format.h), written
// and read a chunk at a time, so a shard of any size fits. Files are
// written to a temporary name, fsync'd, renamed into place and the
// directory fsync'd, so a crash leaves either the old set of files or the
// new one.
#ifndef ASYNCPS_SERVER_CHECKPOINT_H_
#define ASYNCPS_SERVER_CHECKPOINT_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/file_system.h"
#include "common/timeline.h"
#include "proto/checkpoint.pb.h"
#include "server/checkpoint_format.h"
#include "server/checkpoint_stream.h"
#include "server/embedding_table.h"
#include "server/shard_store.h"

namespace asyncps {

// "<dir>/shard-<shard>-<unix_micros, 20 digits>.ckpt": names sort by time.
std::string CheckpointPath(const std::string& dir, int shard,
                           int64_t unix_micros);

// "<dir>/job-<tag>-shard-<shard>.ckpt": a job checkpoint (psctl checkpoint),
// outside the periodic files' names, so never pruned nor restored unless
// asked for (--restore_job).
std::string JobCheckpointPath(const std::string& dir, const std::string& tag,
                              int shard);
// OK if `tag` may name a job checkpoint; else INVALID_ARGUMENT saying why.
absl::Status CheckJobTag(const std::string& tag);

// Every function below does its file operations through `fs`.

// Writes `path` through a temporary file: write, fsync, rename, fsync the
// directory. On error the temporary file is removed (as far as `fs` lets)
// and `path` is untouched. (WriteChunkedFile streams one from a producer.)
absl::Status WriteCheckpointFile(FileSystem* fs, const std::string& path,
                                 const v1::ShardCheckpoint& checkpoint,
                                 size_t chunk_bytes = kCheckpointChunkBytes);

// DATA_LOSS naming the file and the problem (bad magic, unknown format,
// truncated, checksum mismatch, unparsable), NOT_FOUND if it is missing.
// The whole checkpoint in memory: ReadChunkedFile streams one into a sink.
absl::StatusOr<v1::ShardCheckpoint> ReadCheckpointFile(FileSystem* fs,
                                                       const std::string& path);

// The paths of the checkpoint files of `shard` in `dir`, newest first;
// none if the directory cannot be listed.
std::vector<std::string> CheckpointFiles(FileSystem* fs, const std::string& dir,
                                         int shard);

// The newest valid checkpoint of `shard` in `dir`; files that fail to read
// are skipped and described in `skipped`. NOT_FOUND if there is none.
absl::StatusOr<v1::ShardCheckpoint> LoadNewestCheckpoint(
    FileSystem* fs, const std::string& dir, int shard,
    std::vector<std::string>* skipped);

// Deletes all but the newest `keep` checkpoint files of `shard`.
void PruneCheckpoints(FileSystem* fs, const std::string& dir, int shard,
                      int keep);

// Writes checkpoints of one shard's store, on request or on a period.
// Thread-safe (one write at a time).
class Checkpointer {
 public:
  // `store`, `fs` and `clock` are borrowed and must outlive this.
  Checkpointer(ShardStore* store, FileSystem* fs, std::string dir, int shard,
               int keep, absl::Duration every, Clock* clock);
  // Writes one now; returns its path.
  absl::StatusOr<std::string> Write();
  // Writes job checkpoint `tag` of this shard; returns its path.
  absl::StatusOr<std::string> WriteJob(const std::string& tag);
  // Writes one if `every` has passed since the last (and there is
  // something to write).
  void MaybeWrite(absl::Time now);
  // Whether a checkpoint would hold anything: a model, or an embedding
  // table (a job of tables alone writes checkpoints without a model).
  bool HasState() const;

  // Each write is a span on `timeline` (borrowed, may be null) from now.
  // REQUIRES: no write in progress.
  void set_timeline(Timeline* timeline) { timeline_ = timeline; }
  // Each checkpoint holds these tables' rows too (borrowed, may be null).
  // REQUIRES: no write in progress.
  void set_embeddings(const EmbeddingTables* tables) { tables_ = tables; }
  // The chunk size of the files (tests make it tiny).
  // REQUIRES: no write in progress.
  void set_chunk_bytes(size_t bytes) { chunk_bytes_ = bytes; }

  // What was written so far.
  struct Record {
    int64_t written = 0;
    int64_t failed = 0;
    absl::Time last = absl::InfinitePast();  // None yet.
    absl::Duration took;                     // Of the last.
    int64_t bytes = 0;                       // Of the last.
  };
  Record record() const;

 private:
  ShardStore* const store_;
  FileSystem* const fs_;
  const std::string dir_;
  const int shard_;
  const int keep_;
  const absl::Duration every_;
  Clock* const clock_;
  // Gives `sink` the shard's state now, a slice or table at a time: the
  // model's slices (if declared) and every table's rows.
  // FAILED_PRECONDITION if there is neither.
  absl::Status Take(int64_t unix_micros, CheckpointSink* sink) const;
  // Writes the state now to `path` and keeps its record.
  absl::Status WriteAndRecord(const std::string& path, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Timeline* timeline_ = nullptr;
  const EmbeddingTables* tables_ = nullptr;
  size_t chunk_bytes_ = kCheckpointChunkBytes;
  mutable absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  Record record_ ABSL_GUARDED_BY(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_H_
