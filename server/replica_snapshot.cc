#include "server/replica_snapshot.h"

#include <zlib.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {
namespace {

absl::Status InSnapshot(const absl::Status& s) {
  if (s.ok()) return s;
  return absl::Status(s.code(),
                      absl::StrCat("the primary's snapshot: ", s.message()));
}

}  // namespace

SnapshotIn::SnapshotIn(ShardStore* store, EmbeddingTables* tables,
                       const v1::ReplicaSnapshot& begin)
    : sink_(store, tables), decoder_(&sink_), tables_(tables) {
  for (const v1::LedgerEntry& e : begin.ledger()) {
    ledger_.push_back({e.client_id(), e.sequence(), e.answer()});
  }
  for (const v1::RowsLedgerEntry& e : begin.rows_ledger()) {
    rows_ledger_.push_back({e.client_id(), e.sequence(), e.answer()});
  }
}

absl::Status SnapshotIn::Chunk(const v1::ReplicaSnapshotChunk& chunk) {
  if (chunk.index() != chunks_) {
    return absl::DataLossError(absl::StrCat("snapshot chunk ", chunk.index(),
                                            " where ", chunks_, " was due"));
  }
  const uint32_t crc = Crc32(0, chunk.chunk());
  if (crc != chunk.crc32()) {
    return absl::DataLossError(
        absl::StrCat("snapshot chunk ", chunks_, ": checksum mismatch"));
  }
  ++chunks_;
  bytes_ += chunk.chunk().size();
  crc_ = static_cast<uint32_t>(
      crc32_combine(crc_, crc, static_cast<z_off_t>(chunk.chunk().size())));
  return InSnapshot(decoder_.Add(chunk.chunk()));
}

absl::Status SnapshotIn::End(const v1::ReplicaSnapshotEnd& end,
                             PushLedger* ledger) {
  if (end.chunks() != chunks_ || end.bytes() != bytes_) {
    return absl::DataLossError(absl::StrCat(
        "the snapshot's end counts ", end.chunks(), " chunks of ", end.bytes(),
        " bytes; ", chunks_, " of ", bytes_, " arrived"));
  }
  if (end.crc32() != crc_) {
    return absl::DataLossError("the snapshot's whole checksum mismatch");
  }
  RETURN_IF_ERROR(InSnapshot(decoder_.Finish()));
  ledger->Import(ledger_);
  if (tables_ != nullptr) tables_->ledger().Import(rows_ledger_);
  return absl::OkStatus();
}

}  // namespace asyncps
