#include "common/partitioner.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace asyncps {
namespace {

v1::ModelSpec MakeSpec(const std::vector<std::vector<int64_t>>& shapes,
                       int shards, uint64_t slice_bytes) {
  v1::ModelSpec spec;
  spec.set_name("m");
  spec.set_num_shards(shards);
  spec.set_slice_bytes(slice_bytes);
  int i = 0;
  for (const auto& shape : shapes) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name("t" + std::to_string(i++));
    t->set_dtype(v1::DTYPE_F32);
    for (int64_t d : shape) t->add_shape(d);
  }
  return spec;
}

// MLP 784-256-128-10: weights and biases.
std::vector<std::vector<int64_t>> Mlp() {
  return {{784, 256}, {256}, {256, 128}, {128}, {128, 10}, {10}};
}

// Every element of every tensor is in exactly one slice, slices are in
// order and contiguous.
void ExpectExactCover(const v1::ModelSpec& spec, const Partition& p) {
  for (int t = 0; t < spec.tensors_size(); ++t) {
    uint64_t next = 0;
    for (int i : p.tensor_slices(t)) {
      const SliceInfo& s = p.slices()[i];
      EXPECT_EQ(s.tensor, t);
      EXPECT_EQ(s.begin, next);
      EXPECT_GT(s.count, 0u);
      EXPECT_LE(s.count * 4, spec.slice_bytes());
      EXPECT_GE(s.shard, 0);
      EXPECT_LT(s.shard, p.num_shards());
      next += s.count;
    }
    EXPECT_EQ(next, p.tensor_elements(t));
  }
  size_t listed = 0;
  for (int t = 0; t < spec.tensors_size(); ++t) {
    listed += p.tensor_slices(t).size();
  }
  EXPECT_EQ(listed, p.slices().size());
}

void ExpectBalanced(const Partition& p, double tolerance) {
  std::vector<uint64_t> bytes = p.ShardBytes();
  const double mean =
      std::accumulate(bytes.begin(), bytes.end(), 0.0) / bytes.size();
  for (size_t i = 0; i < bytes.size(); ++i) {
    EXPECT_LE(std::abs(bytes[i] - mean), tolerance * mean)
        << "shard " << i << " of " << bytes.size() << " holds " << bytes[i]
        << " bytes, mean " << mean;
  }
}

TEST(Partitioner, MlpSmallSlicesCoverAndBalanceOnOneToEightShards) {
  for (int shards = 1; shards <= 8; ++shards) {
    v1::ModelSpec spec = MakeSpec(Mlp(), shards, 4096);
    auto p = Partition::Create(spec);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectExactCover(spec, *p);
    ExpectBalanced(*p, 0.05);
  }
}

TEST(Partitioner, MlpDefaultSliceBytesStillBalances) {
  // 4 MiB slices would leave the 784x256 weight whole on one shard; the
  // partitioner cuts finer for a small model.
  for (int shards = 1; shards <= 8; ++shards) {
    v1::ModelSpec spec = MakeSpec(Mlp(), shards, 4 << 20);
    auto p = Partition::Create(spec);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectExactCover(spec, *p);
    ExpectBalanced(*p, 0.05);
  }
}

TEST(Partitioner, OneHugeTensorAmongSmallOnesBalances) {
  for (int shards = 1; shards <= 8; ++shards) {
    v1::ModelSpec spec =
        MakeSpec({{30000, 1024}, {10}, {7, 3}, {1}, {1000}}, shards, 4 << 20);
    auto p = Partition::Create(spec);
    ASSERT_TRUE(p.ok()) << p.status();
    ExpectExactCover(spec, *p);
    ExpectBalanced(*p, 0.05);
  }
}

TEST(Partitioner, SamePlacementComputedTwice) {
  v1::ModelSpec spec = MakeSpec(Mlp(), 3, 4096);
  auto a = Partition::Create(spec);
  auto b = Partition::Create(spec);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->slices().size(), b->slices().size());
  for (size_t i = 0; i < a->slices().size(); ++i) {
    EXPECT_EQ(a->slices()[i].shard, b->slices()[i].shard);
    EXPECT_EQ(a->slices()[i].begin, b->slices()[i].begin);
    EXPECT_EQ(a->slices()[i].count, b->slices()[i].count);
  }
}

TEST(Partitioner, RejectsUnusableSpecs) {
  EXPECT_EQ(Partition::Create(MakeSpec(Mlp(), 0, 4096)).status().code(),
            absl::StatusCode::kInvalidArgument);
  // Regression (request_fuzzer): refused before a per-shard table of
  // 528 million entries is allocated.
  EXPECT_EQ(Partition::Create(MakeSpec(Mlp(), 528482304, 4096)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Partition::Create(MakeSpec({{3, 0}}, 2, 4096)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Partition::Create(MakeSpec({}, 2, 4096)).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::ModelSpec bf16 = MakeSpec({{4}}, 1, 4096);
  bf16.mutable_tensors(0)->set_dtype(v1::DTYPE_BF16);
  EXPECT_EQ(Partition::Create(bf16).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Regression: a 2·10^7-element tensor cut 4 bytes a slice made 2·10^7
// slices and kept a shard busy past a 120 s deadline on one DeclareModel.
TEST(Partitioner, RefusesAbsurdlyManySlicesBeforeBuildingThem) {
  auto p = Partition::Create(MakeSpec({{20000000}}, 2, 4));
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("raise slice_bytes"), std::string::npos)
      << p.status();
  // The same tensor in 4 KiB slices is fine.
  EXPECT_TRUE(Partition::Create(MakeSpec({{20000000}}, 2, 4096)).ok());
}

TEST(Partitioner, MoreShardsThanElements) {
  v1::ModelSpec spec = MakeSpec({{3}}, 8, 4096);
  auto p = Partition::Create(spec);
  ASSERT_TRUE(p.ok()) << p.status();
  ExpectExactCover(spec, *p);
  // Too small to be worth cutting: one slice, seven shards hold nothing.
  EXPECT_EQ(p->slices().size(), 1u);
}

}  // namespace
}  // namespace asyncps
