// RestoreSink: a CheckpointSink (server/checkpoint_stream.h) that restores
// a shard from a checkpoint as it streams in, a slice at a time, so a
// restore needs one slice beside the restored state, not a second copy of
// the shard. Nothing is served from it until Finish, which comes only once
// the whole stream checked out (a file's trailer, a snapshot's end): a
// damaged stream changes nothing. Not thread-safe.
#ifndef ASYNCPS_SERVER_CHECKPOINT_RESTORE_H_
#define ASYNCPS_SERVER_CHECKPOINT_RESTORE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "server/checkpoint_stream.h"
#include "server/embedding_table.h"
#include "server/shard_store.h"

namespace asyncps {

class RestoreSink final : public CheckpointSink {
 public:
  // `store` and `tables` are borrowed and must outlive this; `tables` may
  // be null (a replica's snapshot holds none: then a table is DATA_LOSS).
  // The store's model is restored if the head has a spec (a checkpoint of
  // tables alone has none); the tables, if given, are replaced by those in
  // the stream.
  RestoreSink(ShardStore* store, EmbeddingTables* tables);

  absl::Status Head(const v1::ShardCheckpoint& head) override;
  absl::Status Slice(v1::SliceCheckpoint* slice) override;
  absl::Status Table(v1::EmbeddingCheckpoint* table) override;
  absl::Status Finish() override;

  // Whether an error came from the store or the tables refusing what the
  // stream held (a checkpoint of another model), not from the stream.
  bool refused() const { return refused_; }
  // The head, once it came; what was restored.
  const v1::ShardCheckpoint& head() const { return head_; }
  int64_t slices() const { return slices_; }
  int64_t tables() const { return tables_in_.embeddings_size(); }

 private:
  absl::Status Refused(absl::Status s);

  ShardStore* const store_;
  EmbeddingTables* const tables_;
  v1::ShardCheckpoint head_;
  std::unique_ptr<ShardStore::Restoring> restoring_;
  // Tables are checked whole and swapped in at Finish (EmbeddingTables::
  // Restore): as big as the tables, which are not what grows past 2 GiB.
  v1::ShardCheckpoint tables_in_;
  int64_t slices_ = 0;
  bool refused_ = false;
};

// How a restore is going, for the log of a shard that starts (issue #44:
// long work shows progress and an ETA): called with the bytes read so far
// (ReadChunkedFile's ReadProgress), it says at most once every `every`
//   restoring PATH: 412 of 1030 MB (40 %), 150 MB/s, ETA 4 s
// (without the total, if the file's size is unknown: 0) through `say`, and
// Done() sums up the whole read. Not thread-safe.
class RestoreProgress {
 public:
  using Say = std::function<void(const std::string&)>;
  RestoreProgress(std::string path, uint64_t total, Clock* clock, Say say,
                  absl::Duration every = absl::Seconds(2));

  void operator()(uint64_t bytes);
  // "1030 MB in 6.9 s (149 MB/s)".
  std::string Done() const;

 private:
  const std::string path_;
  const uint64_t total_;
  Clock* const clock_;
  const Say say_;
  const absl::Duration every_;
  const absl::Time start_;
  absl::Time said_;
  uint64_t bytes_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CHECKPOINT_RESTORE_H_
