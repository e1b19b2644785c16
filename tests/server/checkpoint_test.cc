// Checkpoint files (round trip; truncated, corrupted and foreign files
// refused by name; the newest valid one chosen) and ShardStore snapshots
// that restore to a store behaving exactly like the original.
#include "server/checkpoint.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/tensor_bytes.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir = std::string(base ? base : "/tmp") + "/" + name;
  std::string cmd = "rm -rf '" + dir + "' && mkdir -p '" + dir + "'";
  EXPECT_EQ(std::system(cmd.c_str()), 0);
  return dir;
}

v1::ModelSpec Spec() {
  v1::ModelSpec spec;
  spec.set_name("m");
  spec.set_seed(3);
  spec.set_slice_bytes(4096);
  spec.set_num_shards(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::MOMENTUM);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_optimizer()->set_momentum(0.9f);
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(3000);
  t->set_dtype(v1::DTYPE_F32);
  t->mutable_init()->set_kind(v1::Initializer::NORMAL);
  t->mutable_init()->set_stddev(1.0f);
  return spec;
}

// Pushes gradient `value` to every slice of `store`.
void PushAll(ShardStore* store, const v1::ModelSpec& spec, float value) {
  auto p = Partition::Create(spec);
  ASSERT_TRUE(p.ok());
  v1::PushRequest req;
  for (const SliceInfo& s : p->slices()) {
    v1::SliceData* d = req.add_gradients();
    d->mutable_key()->set_tensor("w");
    d->mutable_key()->set_index(s.index);
    d->mutable_key()->set_begin(s.begin);
    d->mutable_key()->set_count(s.count);
    d->set_dtype(v1::DTYPE_F32);
    std::vector<float> g(s.count, value);
    EncodeF32(g, d->mutable_data());
  }
  v1::PushResponse resp;
  ASSERT_TRUE(store->Push(req, &resp).ok());
}

std::string Bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void Put(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

TEST(Checkpoint, RestoredStoreBehavesLikeTheOriginal) {
  const std::string dir = TempDir("restore");
  ShardStore a(0, 1, 64 << 20);
  ASSERT_TRUE(a.Declare(Spec()).ok());
  PushAll(&a, Spec(), 1.0f);
  PushAll(&a, Spec(), -0.5f);
  Checkpointer checkpointer(&a, dir, 0, 3, absl::ZeroDuration(), Clock::Real());
  auto path = checkpointer.Write();
  ASSERT_TRUE(path.ok()) << path.status();
  auto loaded = ReadCheckpointFile(*path);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  ShardStore b(0, 1, 64 << 20);
  ASSERT_TRUE(b.Restore(*loaded).ok());
  // The same next push (momentum state included) gives the same weights.
  PushAll(&a, Spec(), 2.0f);
  PushAll(&b, Spec(), 2.0f);
  auto sa = a.Snapshot();
  auto sb = b.Snapshot();
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_EQ(sa->slices_size(), sb->slices_size());
  for (int i = 0; i < sa->slices_size(); ++i) {
    EXPECT_EQ(sa->slices(i).weights(), sb->slices(i).weights());
    EXPECT_EQ(sa->slices(i).slot1(), sb->slices(i).slot1());
    EXPECT_EQ(sa->slices(i).version(), 3);
    EXPECT_EQ(sb->slices(i).version(), 3);
  }
  // A second store cannot take a checkpoint over a declared model.
  EXPECT_EQ(b.Restore(*loaded).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(Checkpoint, DamagedFilesAreRefusedByName) {
  const std::string dir = TempDir("damaged");
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(Spec()).ok());
  auto snapshot = store.Snapshot();
  ASSERT_TRUE(snapshot.ok());
  const std::string path = CheckpointPath(dir, 0, 1);
  ASSERT_TRUE(WriteCheckpointFile(path, *snapshot).ok());
  const std::string good = Bytes(path);

  Put(path, good.substr(0, good.size() - 10));
  auto r = ReadCheckpointFile(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("truncated"), absl::string_view::npos);
  EXPECT_NE(r.status().message().find(path), absl::string_view::npos);

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  Put(path, flipped);
  r = ReadCheckpointFile(path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum"), absl::string_view::npos);

  Put(path, "NOTACKPT" + good.substr(8));
  r = ReadCheckpointFile(path);
  EXPECT_NE(r.status().message().find("bad magic"), absl::string_view::npos);

  Put(path, good.substr(0, 5));
  r = ReadCheckpointFile(path);
  EXPECT_NE(r.status().message().find("truncated header"),
            absl::string_view::npos);

  EXPECT_EQ(ReadCheckpointFile(dir + "/none.ckpt").status().code(),
            absl::StatusCode::kNotFound);
}

TEST(Checkpoint, NewestValidIsLoadedAndOldOnesPruned) {
  const std::string dir = TempDir("newest");
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(Spec()).ok());
  auto v0 = store.Snapshot();
  PushAll(&store, Spec(), 1.0f);
  auto v1 = store.Snapshot();
  ASSERT_TRUE(v0.ok() && v1.ok());
  ASSERT_TRUE(WriteCheckpointFile(CheckpointPath(dir, 0, 100), *v0).ok());
  ASSERT_TRUE(WriteCheckpointFile(CheckpointPath(dir, 0, 200), *v1).ok());
  // The newest is cut short by a crash: the one before it is used.
  Put(CheckpointPath(dir, 0, 300), "ASYNCPSC");
  std::vector<std::string> skipped;
  auto newest = LoadNewestCheckpoint(dir, 0, &skipped);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->slices(0).version(), 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("300"), std::string::npos) << skipped[0];
  EXPECT_EQ(LoadNewestCheckpoint(dir, 7, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  PruneCheckpoints(dir, 0, 1);
  skipped.clear();
  EXPECT_EQ(LoadNewestCheckpoint(dir, 0, &skipped).status().code(),
            absl::StatusCode::kNotFound);  // Only the broken newest is left.
}

TEST(Checkpoint, CheckpointOfAnotherShardOrModelIsRefused) {
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(Spec()).ok());
  auto snapshot = store.Snapshot();
  ASSERT_TRUE(snapshot.ok());
  v1::ShardCheckpoint other = *snapshot;
  other.set_shard(1);
  ShardStore fresh(0, 1, 64 << 20);
  EXPECT_EQ(fresh.Restore(other).code(), absl::StatusCode::kFailedPrecondition);
  other = *snapshot;
  other.mutable_slices(0)->mutable_weights()->resize(12);
  EXPECT_EQ(fresh.Restore(other).code(), absl::StatusCode::kDataLoss);
  EXPECT_FALSE(fresh.declared());  // Nothing changed.
}

}  // namespace
}  // namespace asyncps
