// SnapshotIn: a joining backup's copy of its primary's state as it streams
// in (server/replication.h): a ReplicaSnapshot op (the push ledger), then
// ReplicaSnapshotChunk ops (the shard's checkpoint in bounded chunks), then
// a ReplicaSnapshotEnd with their count and CRC-32. Each chunk is checked
// and loaded into the store's restore as it comes, but the store serves
// none of it, and the ledger is not handed over, until the end arrived and
// everything checked out. Not thread-safe.
#ifndef ASYNCPS_SERVER_REPLICA_SNAPSHOT_H_
#define ASYNCPS_SERVER_REPLICA_SNAPSHOT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/asyncps.pb.h"
#include "server/checkpoint_restore.h"
#include "server/checkpoint_stream.h"
#include "server/push_ledger.h"
#include "server/shard_store.h"

namespace asyncps {

class SnapshotIn {
 public:
  // `store` is borrowed and must outlive this; it must hold no model.
  SnapshotIn(ShardStore* store, const v1::ReplicaSnapshot& begin);
  SnapshotIn(const SnapshotIn&) = delete;
  SnapshotIn& operator=(const SnapshotIn&) = delete;

  // DATA_LOSS if the chunk is out of order, damaged, or does not parse;
  // the store's refusal (another model) as it is.
  absl::Status Chunk(const v1::ReplicaSnapshotChunk& chunk);
  // Checks the count and the CRC-32 of every chunk, then makes the store
  // serve the snapshot's state; returns the ledger to import. DATA_LOSS if
  // anything is missing or damaged (the store is left as it was).
  absl::StatusOr<std::vector<PushLedger::Remembered>> End(
      const v1::ReplicaSnapshotEnd& end);

  uint64_t bytes() const { return bytes_; }

 private:
  RestoreSink sink_;
  ChunkDecoder decoder_;
  std::vector<PushLedger::Remembered> ledger_;
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_SNAPSHOT_H_
