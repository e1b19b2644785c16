#include "server/checkpoint_stream.h"

#include <zlib.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {
namespace {

// The fields of an item that grow with the model, in the order a cut item
// carries them; the other fields are a few bytes.
std::vector<std::string*> BytesFields(v1::SliceCheckpoint* s) {
  return {s->mutable_weights(), s->mutable_slot1(), s->mutable_slot2(),
          s->mutable_step_sum()};
}
std::vector<std::string*> BytesFields(v1::EmbeddingCheckpoint* e) {
  return {e->mutable_ids(),     e->mutable_weights(), e->mutable_slot1(),
          e->mutable_slot2(),   e->mutable_steps(),   e->mutable_step_ids(),
          e->mutable_step_sum()};
}

v1::SliceCheckpoint* SlicePart(v1::CheckpointChunk* c) {
  return c->mutable_slice();
}
v1::EmbeddingCheckpoint* TablePart(v1::CheckpointChunk* c) {
  return c->mutable_embedding();
}

template <typename Item>
void Append(Item* from, Item* to) {
  std::vector<std::string*> src = BytesFields(from);
  std::vector<std::string*> dst = BytesFields(to);
  for (size_t j = 0; j < src.size(); ++j) dst[j]->append(*src[j]);
}

}  // namespace

uint32_t Crc32(uint32_t crc, absl::string_view data) {
  // zlib takes a 32-bit length.
  constexpr size_t kStep = size_t{1} << 30;
  while (!data.empty()) {
    const size_t n = std::min(kStep, data.size());
    crc = static_cast<uint32_t>(
        crc32(crc, reinterpret_cast<const Bytef*>(data.data()),
              static_cast<uInt>(n)));
    data.remove_prefix(n);
  }
  return crc;
}

absl::Status FeedCheckpoint(const v1::ShardCheckpoint& checkpoint,
                            CheckpointSink* sink) {
  v1::ShardCheckpoint head;
  if (checkpoint.has_spec()) *head.mutable_spec() = checkpoint.spec();
  head.set_shard(checkpoint.shard());
  head.set_unix_micros(checkpoint.unix_micros());
  RETURN_IF_ERROR(sink->Head(head));
  for (const v1::SliceCheckpoint& s : checkpoint.slices()) {
    v1::SliceCheckpoint copy = s;
    RETURN_IF_ERROR(sink->Slice(&copy));
  }
  for (const v1::EmbeddingCheckpoint& e : checkpoint.embeddings()) {
    v1::EmbeddingCheckpoint copy = e;
    RETURN_IF_ERROR(sink->Table(&copy));
  }
  return absl::OkStatus();
}

absl::Status CheckpointCollector::Head(const v1::ShardCheckpoint& head) {
  checkpoint_ = head;
  return absl::OkStatus();
}

absl::Status CheckpointCollector::Slice(v1::SliceCheckpoint* slice) {
  checkpoint_.add_slices()->Swap(slice);
  return absl::OkStatus();
}

absl::Status CheckpointCollector::Table(v1::EmbeddingCheckpoint* table) {
  checkpoint_.add_embeddings()->Swap(table);
  return absl::OkStatus();
}

ChunkEncoder::ChunkEncoder(size_t chunk_bytes, Output out)
    : chunk_bytes_(std::max<size_t>(1, chunk_bytes)), out_(std::move(out)) {}

absl::Status ChunkEncoder::Emit(const v1::CheckpointChunk& chunk) {
  std::string bytes;
  if (!chunk.SerializeToString(&bytes)) {
    return absl::InternalError("cannot serialize a checkpoint chunk");
  }
  if (bytes.size() > kMaxChunkBytes) {
    // Only the spec could make it so; no reader would take it.
    return absl::InternalError(
        absl::StrCat("a checkpoint chunk of ", bytes.size(),
                     " bytes is over the limit of ", kMaxChunkBytes));
  }
  ++chunks_;
  bytes_ += bytes.size();
  const uint32_t crc = Crc32(0, bytes);
  crc_ = static_cast<uint32_t>(
      crc32_combine(crc_, crc, static_cast<z_off_t>(bytes.size())));
  return out_(std::move(bytes), crc);
}

template <typename Item>
absl::Status ChunkEncoder::Cut(Item* item,
                               Item* (*part)(v1::CheckpointChunk*)) {
  // The bytes move out of `item` (no copy); the first chunk takes the rest
  // of it, and as many of the bytes as fit.
  std::vector<std::string> data;
  for (std::string* f : BytesFields(item)) data.push_back(std::move(*f));
  for (std::string* f : BytesFields(item)) f->clear();
  v1::CheckpointChunk chunk;
  part(&chunk)->Swap(item);
  size_t room = chunk_bytes_;
  for (size_t j = 0; j < data.size(); ++j) {
    size_t at = 0;
    while (at < data[j].size()) {
      if (room == 0) {
        RETURN_IF_ERROR(Emit(chunk));
        chunk.Clear();
        part(&chunk);
        chunk.set_continued(true);
        room = chunk_bytes_;
      }
      const size_t n = std::min(room, data[j].size() - at);
      BytesFields(part(&chunk))[j]->append(data[j], at, n);
      at += n;
      room -= n;
    }
    std::string().swap(data[j]);  // Gone as soon as it is cut.
  }
  return Emit(chunk);
}

absl::Status ChunkEncoder::Head(const v1::ShardCheckpoint& head) {
  v1::CheckpointChunk chunk;
  *chunk.mutable_head() = head;
  chunk.mutable_head()->clear_slices();
  chunk.mutable_head()->clear_embeddings();
  return Emit(chunk);
}

absl::Status ChunkEncoder::Slice(v1::SliceCheckpoint* slice) {
  return Cut(slice, &SlicePart);
}

absl::Status ChunkEncoder::Table(v1::EmbeddingCheckpoint* table) {
  return Cut(table, &TablePart);
}

absl::Status ChunkDecoder::Loss(absl::string_view why) const {
  return absl::DataLossError(absl::StrCat("chunk ", chunks_, ": ", why));
}

absl::Status ChunkDecoder::Add(absl::string_view bytes) {
  v1::CheckpointChunk chunk;
  if (bytes.size() > kMaxChunkBytes ||
      !chunk.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return Loss("does not parse");
  }
  absl::Status s;
  switch (chunk.part_case()) {
    case v1::CheckpointChunk::kHead:
      if (head_) return Loss("a second head");
      if (chunk.continued()) return Loss("a head that continues something");
      head_ = true;
      s = sink_->Head(chunk.head());
      break;
    case v1::CheckpointChunk::kSlice:
    case v1::CheckpointChunk::kEmbedding:
      if (!head_) return Loss("a slice or table before the head");
      if (!chunk.continued()) {
        s = Flush();
        item_ = std::move(chunk);
      } else if (!item_.has_value() ||
                 item_->part_case() != chunk.part_case()) {
        return Loss("continues no slice or table");
      } else if (chunk.has_slice()) {
        Append(chunk.mutable_slice(), item_->mutable_slice());
      } else {
        Append(chunk.mutable_embedding(), item_->mutable_embedding());
      }
      break;
    default:
      return Loss("holds nothing");
  }
  ++chunks_;
  return s;
}

absl::Status ChunkDecoder::Flush() {
  if (!item_.has_value()) return absl::OkStatus();
  v1::CheckpointChunk item = *std::move(item_);
  item_.reset();
  return item.has_slice() ? sink_->Slice(item.mutable_slice())
                          : sink_->Table(item.mutable_embedding());
}

absl::Status ChunkDecoder::Finish() {
  RETURN_IF_ERROR(Flush());
  if (!head_) return absl::DataLossError("no chunk: an empty checkpoint");
  return sink_->Finish();
}

}  // namespace asyncps
