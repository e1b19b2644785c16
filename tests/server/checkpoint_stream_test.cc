// Checkpoints in bounded chunks (server/checkpoint_stream.h, server/
// checkpoint_format.h) with a tiny chunk size, so a small model makes many
// chunks and every slice is cut over several: a byte-exact round trip, a
// damaged chunk, a truncated file at every length, a lying length, a bad
// whole checksum, a dropped chunk, a format-1 file, and a restore streamed
// into a store that changes nothing unless the whole file checked out.
#include "server/checkpoint_stream.h"

#include <algorithm>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/tensor_bytes.h"
#include "common/testing/fault_file_system.h"
#include "gtest/gtest.h"
#include "server/checkpoint.h"
#include "server/checkpoint_format.h"
#include "server/checkpoint_restore.h"
#include "server/shard_store.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

using ::asyncps::testing::FaultFileSystem;

constexpr char kPath[] = "/ckpt/shard-0-1.ckpt";
constexpr size_t kTinyChunk = 1024;

v1::ModelSpec Spec() { return testing::ChunkyModel(); }

// A store of Spec() after two pushes, and its state, with an embedding
// table's worth of bytes added so that kind of item is cut too.
struct Trained {
  Trained() : store(0, 1, 64 << 20) {
    EXPECT_TRUE(store.Declare(Spec()).ok());
    for (float g : {0.5f, -0.25f}) {
      v1::PushResponse resp;
      EXPECT_TRUE(store.Push(testing::ChunkyModelPush(g), &resp).ok());
    }
    auto snapshot = store.Snapshot();
    EXPECT_TRUE(snapshot.ok());
    checkpoint = *snapshot;
    checkpoint.set_unix_micros(42);
    v1::EmbeddingCheckpoint* e = checkpoint.add_embeddings();
    e->mutable_spec()->set_name("e");
    e->set_ids(std::string(8 * 300, '\x01'));
    e->set_weights(std::string(4 * 300 * 4, '\x02'));
    e->set_steps(std::string(8 * 300, '\x03'));
  }
  ShardStore store;
  v1::ShardCheckpoint checkpoint;
};

// The file's records as (offset, kind, length).
struct RecordAt {
  size_t at;
  uint32_t kind;
  uint64_t length;
};
std::vector<RecordAt> Records(const std::string& file) {
  std::vector<RecordAt> out;
  size_t at = 16;
  while (at + 16 <= file.size()) {
    RecordAt r{at, 0, 0};
    for (int i = 0; i < 4; ++i) {
      r.kind |= uint32_t{static_cast<unsigned char>(file[at + i])} << (8 * i);
    }
    for (int i = 0; i < 8; ++i) {
      r.length |= uint64_t{static_cast<unsigned char>(file[at + 4 + i])}
                  << (8 * i);
    }
    out.push_back(r);
    at += 16 + r.length;
  }
  return out;
}

std::string Written(FaultFileSystem* fs, const v1::ShardCheckpoint& c) {
  EXPECT_TRUE(WriteCheckpointFile(fs, kPath, c, kTinyChunk).ok());
  return *fs->ReadFile(kPath);
}

absl::Status ReadBack(FaultFileSystem* fs, const std::string& data) {
  fs->WriteFileForTest(kPath, data);
  return ReadCheckpointFile(fs, kPath).status();
}

TEST(CheckpointStream, ManySmallChunksRoundTripByteExactly) {
  Trained t;
  FaultFileSystem fs;
  const std::string file = Written(&fs, t.checkpoint);
  const std::vector<RecordAt> records = Records(file);
  // 3 slices of 12 KiB and a table of 9 KiB, in 1 KiB chunks.
  EXPECT_GT(records.size(), 40u);
  for (size_t i = 1; i + 1 < records.size(); ++i) {
    EXPECT_LE(records[i].length, kTinyChunk + 64) << "chunk " << i;
  }
  auto back = ReadCheckpointFile(&fs, kPath);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), t.checkpoint.SerializeAsString());
}

TEST(CheckpointStream, EncoderKeepsEveryChunkBounded) {
  Trained t;
  std::vector<std::string> chunks;
  ChunkEncoder encoder(kTinyChunk, [&](std::string c, uint32_t crc) {
    EXPECT_EQ(crc, Crc32(0, c));
    chunks.push_back(std::move(c));
    return absl::OkStatus();
  });
  ASSERT_TRUE(FeedCheckpoint(t.checkpoint, &encoder).ok());
  EXPECT_EQ(encoder.chunks(), chunks.size());
  uint32_t crc = 0;
  for (const std::string& c : chunks) crc = Crc32(crc, c);
  EXPECT_EQ(crc, encoder.crc());
  // A slice's chunks are continued ones after the first.
  int continued = 0;
  for (const std::string& c : chunks) {
    v1::CheckpointChunk parsed;
    ASSERT_TRUE(parsed.ParseFromString(c));
    if (parsed.continued()) ++continued;
  }
  EXPECT_GT(continued, 30);

  CheckpointCollector collected;
  ChunkDecoder decoder(&collected);
  for (const std::string& c : chunks) ASSERT_TRUE(decoder.Add(c).ok());
  ASSERT_TRUE(decoder.Finish().ok());
  EXPECT_EQ(collected.checkpoint().SerializeAsString(),
            t.checkpoint.SerializeAsString());
}

TEST(CheckpointStream, ADamagedChunkIsRefusedByName) {
  Trained t;
  FaultFileSystem fs;
  std::string file = Written(&fs, t.checkpoint);
  const RecordAt r = Records(file)[7];
  file[r.at + 16 + r.length / 2] ^= 0x10;
  absl::Status s = ReadBack(&fs, file);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("checksum mismatch in chunk 7"),
            absl::string_view::npos)
      << s;
  EXPECT_NE(s.message().find(kPath), absl::string_view::npos);
}

TEST(CheckpointStream, EveryTruncationIsDataLoss) {
  Trained t;
  FaultFileSystem fs;
  const std::string file = Written(&fs, t.checkpoint);
  for (size_t n = 0; n < file.size(); n += 37) {
    absl::Status s = ReadBack(&fs, file.substr(0, n));
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << n << ": " << s;
    EXPECT_NE(s.message().find("truncated"), absl::string_view::npos) << s;
  }
  EXPECT_EQ(ReadBack(&fs, file + "x").code(), absl::StatusCode::kDataLoss);
}

TEST(CheckpointStream, ALyingLengthAllocatesNothingAndIsRefused) {
  Trained t;
  FaultFileSystem fs;
  std::string file = Written(&fs, t.checkpoint);
  const RecordAt r = Records(file)[3];
  for (int i = 0; i < 8; ++i) file[r.at + 4 + i] = '\x7f';
  absl::Status s = ReadBack(&fs, file);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("chunk 3 claims"), absl::string_view::npos) << s;
}

TEST(CheckpointStream, ABadWholeChecksumOrAMissingChunkIsRefused) {
  Trained t;
  FaultFileSystem fs;
  const std::string file = Written(&fs, t.checkpoint);
  const std::vector<RecordAt> records = Records(file);

  // Two continuations of slices, of the same length, swapped: each chunk
  // checks out, the whole does not.
  auto continues = [&](const RecordAt& r) {
    v1::CheckpointChunk c;
    return c.ParseFromString(file.substr(r.at + 16, r.length)) &&
           c.continued() && c.has_slice();
  };
  size_t a = 0, b = 0;
  for (size_t i = 2; i + 1 < records.size() && b == 0; ++i) {
    for (size_t j = i + 1; j + 1 < records.size(); ++j) {
      if (records[i].length == records[j].length && continues(records[i]) &&
          continues(records[j]) &&
          file.compare(records[i].at, 16 + records[i].length, file,
                       records[j].at, 16 + records[j].length) != 0) {
        a = i;
        b = j;
        break;
      }
    }
  }
  ASSERT_NE(b, 0u);
  std::string swapped = file;
  const size_t len = 16 + records[a].length;
  swapped.replace(records[a].at, len, file, records[b].at, len);
  swapped.replace(records[b].at, len, file, records[a].at, len);
  absl::Status s = ReadBack(&fs, swapped);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("whole-file checksum mismatch"),
            absl::string_view::npos)
      << s;

  // A chunk cut out whole: the trailer's count says so.
  const RecordAt& r = records[5];
  std::string dropped = file;
  dropped.erase(r.at, 16 + r.length);
  s = ReadBack(&fs, dropped);
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(s.message().find("the trailer counts"), absl::string_view::npos)
      << s;
}

TEST(CheckpointStream, AFormat1FileIsStillRead) {
  Trained t;
  std::string payload = t.checkpoint.SerializeAsString();
  std::string file = "ASYNCPSC";
  auto put = [&](uint64_t v, int n) {
    for (int i = 0; i < n; ++i) file.push_back(static_cast<char>(v >> (8 * i)));
  };
  put(1, 4);
  put(payload.size(), 8);
  put(Crc32(0, payload), 4);
  file += payload;
  FaultFileSystem fs;
  fs.WriteFileForTest(kPath, file);
  auto back = ReadCheckpointFile(&fs, kPath);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->SerializeAsString(), t.checkpoint.SerializeAsString());
}

TEST(CheckpointStream, ARestoreStreamsInOnlyOnceTheWholeFileCheckedOut) {
  Trained t;
  t.checkpoint.clear_embeddings();
  FaultFileSystem fs;
  std::string file = Written(&fs, t.checkpoint);

  // Damaged in the last chunk: every slice before it was loaded, yet the
  // store serves nothing.
  const std::vector<RecordAt> records = Records(file);
  const RecordAt& last = records[records.size() - 2];
  std::string damaged = file;
  damaged[last.at + 16 + 3] ^= 0x01;
  fs.WriteFileForTest(kPath, damaged);
  ShardStore fresh(0, 1, 64 << 20);
  RestoreSink refused(&fresh, nullptr);
  EXPECT_EQ(ReadChunkedFile(&fs, kPath, &refused).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_FALSE(refused.refused());
  EXPECT_FALSE(fresh.declared());

  fs.WriteFileForTest(kPath, file);
  RestoreSink sink(&fresh, nullptr);
  ASSERT_TRUE(ReadChunkedFile(&fs, kPath, &sink).ok());
  EXPECT_EQ(sink.slices(), 3);
  auto again = fresh.Snapshot();
  ASSERT_TRUE(again.ok());
  again->set_unix_micros(42);
  EXPECT_EQ(again->SerializeAsString(), t.checkpoint.SerializeAsString());
}

// `t`'s store as a Checkpointer writes it into `fs` in tiny chunks; the
// file's path, and in `*bytes` (if given) the size the Checkpointer says.
absl::StatusOr<std::string> WriteInTinyChunks(Trained* t, FaultFileSystem* fs,
                                              int64_t* bytes = nullptr) {
  Checkpointer checkpointer(&t->store, fs, "/ckpt", 0, 3, absl::ZeroDuration(),
                            Clock::Real());
  checkpointer.set_chunk_bytes(kTinyChunk);
  auto path = checkpointer.Write();
  if (bytes != nullptr) *bytes = checkpointer.record().bytes;
  return path;
}

TEST(CheckpointStream, ACheckpointerWritesSmallChunksThatRestore) {
  Trained t;
  FaultFileSystem fs;
  int64_t bytes = 0;
  auto path = WriteInTinyChunks(&t, &fs, &bytes);
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_GT(Records(*fs.ReadFile(*path)).size(), 30u);
  EXPECT_EQ(bytes, static_cast<int64_t>(fs.ReadFile(*path)->size()));
  ShardStore fresh(0, 1, 64 << 20);
  RestoreSink sink(&fresh, nullptr);
  ASSERT_TRUE(ReadChunkedFile(&fs, *path, &sink).ok());
  EXPECT_EQ(fresh.Snapshot()->SerializeAsString(),
            t.store.Snapshot()->SerializeAsString());
}

// Issue #44: a restore says how far it is and when it will be done, at
// most every `every`, and ends with the whole read.
TEST(CheckpointStream, ARestoreSaysHowFarItIsAndWhenItWillBeDone) {
  ManualClock clock;
  std::vector<std::string> said;
  auto say = [&said](const std::string& line) { said.push_back(line); };
  RestoreProgress known("/c", 1000000000, &clock, say, absl::Seconds(1));
  known(100000000);  // Not a second yet: nothing said.
  clock.Advance(absl::Seconds(1));
  known(400000000);
  RestoreProgress unknown("/d", 0, &clock, say, absl::Seconds(1));
  clock.Advance(absl::Seconds(2));
  unknown(300000000);
  EXPECT_EQ(said, (std::vector<std::string>{
                      "restoring /c: 400 of 1000 MB (40 %), 400 MB/s, ETA 2 s",
                      "restoring /d: 300 MB, 150 MB/s"}));
  EXPECT_EQ(unknown.Done(), "300 MB in 2.0 s (150 MB/s)");

  // Through a real read: the bytes grow to the file's size, and the lines
  // come once per `every` of the read, not once per chunk.
  Trained t;
  FaultFileSystem fs;
  auto path = WriteInTinyChunks(&t, &fs);
  ASSERT_TRUE(path.ok()) << path.status();
  auto size = fs.FileSize(*path);
  ASSERT_TRUE(size.ok()) << size.status();
  said.clear();
  RestoreProgress progress(*path, *size, &clock, say, absl::Seconds(2));
  std::vector<uint64_t> seen;
  ShardStore fresh(0, 1, 64 << 20);
  RestoreSink sink(&fresh, nullptr);
  ASSERT_TRUE(ReadChunkedFile(&fs, *path, &sink, [&](uint64_t bytes) {
                seen.push_back(bytes);
                clock.Advance(absl::Milliseconds(100));
                progress(bytes);
              }).ok());
  ASSERT_GT(seen.size(), 40u);
  EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()));
  EXPECT_EQ(seen.back(), *size);
  EXPECT_EQ(said.size(), seen.size() / 20);
  for (const std::string& line : said) {
    EXPECT_NE(line.find("restoring " + *path), std::string::npos) << line;
    EXPECT_NE(line.find(" %), "), std::string::npos) << line;
    EXPECT_NE(line.find(", ETA "), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace asyncps
