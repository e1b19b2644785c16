// The IDX reader on good files and on each kind of corrupted file.
#include "worker/data/idx_reader.h"

#include <zlib.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "worker/data/data_loader.h"

namespace asyncps {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir ? dir : "/tmp") + "/" + name;
}

void WriteGz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  if (!bytes.empty()) gzwrite(f, bytes.data(), bytes.size());
  gzclose(f);
}

void Be32(std::vector<uint8_t>* out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out->push_back((v >> s) & 0xff);
}

std::vector<uint8_t> Images(uint32_t magic, uint32_t n, uint32_t rows,
                            uint32_t cols, size_t pixels) {
  std::vector<uint8_t> b;
  Be32(&b, magic);
  Be32(&b, n);
  Be32(&b, rows);
  Be32(&b, cols);
  for (size_t i = 0; i < pixels; ++i) b.push_back(static_cast<uint8_t>(i * 51));
  return b;
}

std::vector<uint8_t> Labels(uint32_t magic, uint32_t n,
                            std::vector<uint8_t> labels) {
  std::vector<uint8_t> b;
  Be32(&b, magic);
  Be32(&b, n);
  b.insert(b.end(), labels.begin(), labels.end());
  return b;
}

class IdxReaderTest : public ::testing::Test {
 protected:
  void Write(const std::vector<uint8_t>& images,
             const std::vector<uint8_t>& labels) {
    WriteGz(images_, images);
    WriteGz(labels_, labels);
  }
  absl::Status ReadStatus() { return ReadIdxPair(images_, labels_).status(); }
  void ExpectError(absl::string_view file, absl::string_view words) {
    absl::Status s = ReadStatus();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(std::string(file)), absl::string_view::npos)
        << s;
    EXPECT_NE(s.message().find(std::string(words)), absl::string_view::npos)
        << s;
  }
  const std::string images_ = TempPath("images.gz");
  const std::string labels_ = TempPath("labels.gz");
};

TEST_F(IdxReaderTest, ReadsGoodFiles) {
  Write(Images(0x803, 3, 2, 2, 12), Labels(0x801, 3, {4, 0, 9}));
  auto d = ReadIdxPair(images_, labels_);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 3);
  EXPECT_EQ(d->features, 4);
  EXPECT_FLOAT_EQ(d->pixels[0], 0.0f);
  EXPECT_FLOAT_EQ(d->pixels[5], 1.0f);  // 5 * 51 = 255.
  EXPECT_FLOAT_EQ(d->pixels[1], 51 / 255.0f);
  EXPECT_EQ(d->labels, (std::vector<uint8_t>{4, 0, 9}));
}

TEST_F(IdxReaderTest, BadMagicNamesFile) {
  Write(Images(0x802, 3, 2, 2, 12), Labels(0x801, 3, {4, 0, 9}));
  ExpectError("images.gz", "bad magic number 0x00000802");
  Write(Images(0x803, 3, 2, 2, 12), Labels(0x803, 3, {4, 0, 9}));
  ExpectError("labels.gz", "bad magic number");
}

TEST_F(IdxReaderTest, TruncatedFilesNamed) {
  Write(Images(0x803, 3, 2, 2, 11), Labels(0x801, 3, {4, 0, 9}));
  ExpectError("images.gz", "truncated");
  Write(Images(0x803, 3, 2, 2, 12), Labels(0x801, 3, {4, 0}));
  ExpectError("labels.gz", "truncated");
  Write({0x00, 0x00}, Labels(0x801, 3, {4, 0, 9}));
  ExpectError("images.gz", "truncated");
}

// Regression (found by tests/fuzz idx_fuzzer): a header claiming 10^8
// images of 4096x4096 made the reader allocate what it claimed (1.6 PB)
// before reading any of it.
TEST_F(IdxReaderTest, AHeaderClaimingHugeImagesIsTruncatedNotAllocated) {
  Write(Images(0x803, 100000000, 4096, 4096, 64), Labels(0x801, 3, {4, 0, 9}));
  ExpectError("images.gz", "truncated");
}

TEST_F(IdxReaderTest, WrongCountNamed) {
  Write(Images(0x803, 3, 2, 2, 12), Labels(0x801, 2, {4, 0}));
  ExpectError("labels.gz", "wrong count");
}

TEST_F(IdxReaderTest, LabelOutOfRangeNamed) {
  Write(Images(0x803, 3, 2, 2, 12), Labels(0x801, 3, {4, 10, 9}));
  ExpectError("labels.gz", "label 10");
}

TEST_F(IdxReaderTest, MissingFileNamed) {
  Write(Images(0x803, 3, 2, 2, 12), Labels(0x801, 3, {4, 0, 9}));
  auto s = ReadIdxPair(images_ + ".nope", labels_).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("images.gz.nope"), absl::string_view::npos);
}

TEST_F(IdxReaderTest, CorruptGzipNamed) {
  std::vector<uint8_t> good;
  {
    WriteGz(images_, Images(0x803, 3, 2, 2, 12));
    FILE* f = fopen(images_.c_str(), "rb");
    int c;
    while ((c = fgetc(f)) != EOF) good.push_back(static_cast<uint8_t>(c));
    fclose(f);
  }
  for (size_t i = 12; i < good.size() - 8; ++i) good[i] ^= 0x5a;
  FILE* f = fopen(images_.c_str(), "wb");
  fwrite(good.data(), 1, good.size(), f);
  fclose(f);
  WriteGz(labels_, Labels(0x801, 3, {4, 0, 9}));
  ExpectError("images.gz", "");
}

TEST(FashionMnist, RealFilesLoad) {
  auto d = ReadFashionMnist("/usr/share/datasets/fashion-mnist", "t10k");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->size, 10000);
  EXPECT_EQ(d->features, 784);
  std::vector<int> counts(10, 0);
  for (uint8_t l : d->labels) ++counts[l];
  for (int c : counts) EXPECT_EQ(c, 1000);  // The test set is balanced.
}

// A data set of `n` one-pixel images whose pixel is the image's index.
Dataset Numbered(int n) {
  Dataset d;
  d.size = n;
  d.features = 1;
  for (int i = 0; i < n; ++i) {
    d.pixels.push_back(static_cast<float>(i));
    d.labels.push_back(0);
  }
  return d;
}

TEST(DataLoader, SharesAreDisjointAndReshuffled) {
  const Dataset d = Numbered(10);
  std::vector<float> x;
  std::vector<int> y;
  std::vector<int> seen(10, 0);
  for (int rank = 0; rank < 2; ++rank) {
    DataLoader loader(&d, rank, 2, 3);
    EXPECT_EQ(loader.share(), 5);
    EXPECT_EQ(loader.NextBatch(5, &x, &y), 5);
    std::vector<float> first = x;
    for (float v : x) ++seen[static_cast<int>(v)];
    EXPECT_EQ(loader.epoch(), 1);
    loader.NextBatch(5, &x, &y);
    EXPECT_EQ(loader.epoch(), 2);
    std::sort(first.begin(), first.end());
    std::sort(x.begin(), x.end());
    EXPECT_EQ(first, x);  // Same share, new epoch.
  }
  for (int c : seen) EXPECT_EQ(c, 1);
  // ShareSize says what a loader's share() will be, without building one.
  for (int rank = 0; rank < 4; ++rank) {
    for (int64_t max : {0, 1, 2, 100}) {
      DataLoader loader(&d, rank, 4, 3, max);
      EXPECT_EQ(DataLoader::ShareSize(d.size, rank, 4, max), loader.share())
          << "rank " << rank << " max " << max;
    }
  }
}

// An elastic job: two workers train epoch 0 on halves; a third joins, and
// from each one's next epoch the three take thirds, disjoint and whole; a
// worker's share changes only at an epoch's start, never within one.
TEST(DataLoader, FollowsTheMembershipAtEachEpochsStart) {
  const Dataset d = Numbered(12);
  std::pair<int, int> shares[3] = {{0, 2}, {1, 2}, {2, 3}};
  std::vector<std::unique_ptr<DataLoader>> loaders;
  for (int w = 0; w < 2; ++w) {
    loaders.push_back(std::make_unique<DataLoader>(&d, w, 2, 3));
    loaders[w]->FollowMembership([&shares, w] { return shares[w]; });
  }
  std::vector<float> x;
  std::vector<int> y;
  std::vector<int> seen(12, 0);
  loaders[0]->NextBatch(3, &x, &y);
  for (float v : x) ++seen[static_cast<int>(v)];
  shares[0] = {0, 3};  // Rank 2 joins in the middle of epoch 0.
  shares[1] = {1, 3};
  loaders[0]->NextBatch(3, &x, &y);  // The rest of its half: epoch 0's.
  for (float v : x) ++seen[static_cast<int>(v)];
  EXPECT_EQ(loaders[0]->epoch(), 1);
  loaders[1]->NextBatch(6, &x, &y);
  for (float v : x) ++seen[static_cast<int>(v)];
  for (int c : seen) EXPECT_EQ(c, 1);  // Epoch 0: each example once.
  loaders.push_back(std::make_unique<DataLoader>(&d, 0, 1, 3));
  loaders[2]->FollowMembership([&shares] { return shares[2]; });
  std::fill(seen.begin(), seen.end(), 0);
  for (auto& loader : loaders) {
    EXPECT_EQ(loader->share(), 4);
    EXPECT_EQ(loader->NextBatch(4, &x, &y), 4);
    for (float v : x) ++seen[static_cast<int>(v)];
  }
  for (int c : seen) EXPECT_EQ(c, 1);  // Thirds: each example once.
}

// A replacement worker skips the batches its rank already trained on and
// carries on with exactly the batches the dead one would have had next,
// across epochs and their reshuffles.
TEST(DataLoader, SkipLandsWhereNextBatchWouldHave) {
  const Dataset d = Numbered(23);
  std::vector<float> x, skipped_x;
  std::vector<int> y;
  for (int batches : {0, 1, 3, 4, 9}) {
    DataLoader read(&d, 1, 2, 7), skip(&d, 1, 2, 7);
    for (int b = 0; b < batches; ++b) read.NextBatch(4, &x, &y);
    skip.Skip(batches, 4);
    EXPECT_EQ(skip.epoch(), read.epoch()) << batches;
    for (int b = 0; b < 5; ++b) {
      EXPECT_EQ(read.NextBatch(4, &x, &y), skip.NextBatch(4, &skipped_x, &y));
      EXPECT_EQ(x, skipped_x) << "after skipping " << batches;
    }
  }
}

}  // namespace
}  // namespace asyncps
