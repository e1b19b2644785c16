// SnapshotIn: a joining backup's copy of its primary's state as it streams
// in (server/replication.h): a ReplicaSnapshot op (the push ledgers), then
// ReplicaSnapshotChunk ops (the shard's checkpoint, its embedding tables
// with their bsp steps in progress too, in bounded chunks), then a
// ReplicaSnapshotEnd with their count and CRC-32. Each chunk is checked
// and loaded into the restore as it comes, but the store and the tables
// serve none of it, and the ledgers are not handed over, until the end
// arrived and everything checked out. Not thread-safe.
#ifndef ASYNCPS_SERVER_REPLICA_SNAPSHOT_H_
#define ASYNCPS_SERVER_REPLICA_SNAPSHOT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/asyncps.pb.h"
#include "server/checkpoint_restore.h"
#include "server/checkpoint_stream.h"
#include "server/embedding_table.h"
#include "server/push_ledger.h"
#include "server/shard_store.h"

namespace asyncps {

class SnapshotIn {
 public:
  // `store` and `tables` (may be null: a shard without tables, which
  // refuses a snapshot holding any) are borrowed and must outlive this;
  // the store must hold no model.
  SnapshotIn(ShardStore* store, EmbeddingTables* tables,
             const v1::ReplicaSnapshot& begin);
  SnapshotIn(const SnapshotIn&) = delete;
  SnapshotIn& operator=(const SnapshotIn&) = delete;

  // DATA_LOSS if the chunk is out of order, damaged, or does not parse;
  // the store's refusal (another model) as it is.
  absl::Status Chunk(const v1::ReplicaSnapshotChunk& chunk);
  // Checks the count and the CRC-32 of every chunk, then makes the store
  // and the tables serve the snapshot's state and imports its ledgers into
  // `ledger` and the tables' own. DATA_LOSS if anything is missing or
  // damaged (nothing is changed).
  absl::Status End(const v1::ReplicaSnapshotEnd& end, PushLedger* ledger);

  uint64_t bytes() const { return bytes_; }

 private:
  RestoreSink sink_;
  ChunkDecoder decoder_;
  EmbeddingTables* const tables_;
  std::vector<PushLedger::Remembered> ledger_;
  std::vector<RowsLedger::Remembered> rows_ledger_;
  uint64_t chunks_ = 0;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_SNAPSHOT_H_
