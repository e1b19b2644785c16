// Checkpoint files through an in-memory, fault-injecting file system: round
// trip; truncated, corrupted and foreign files refused by name; the newest
// valid one chosen; a full disk, a failed fsync, a crash before the rename
// and a power cut never leave a bad newest checkpoint. And ShardStore
// snapshots that restore to a store behaving exactly like the original.
#include "server/checkpoint.h"

#include <string>
#include <vector>

#include "common/tensor_bytes.h"
#include "common/testing/fault_file_system.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

using ::asyncps::testing::FaultFileSystem;

constexpr char kDir[] = "/ckpt";

v1::ModelSpec Spec(
    v1::OptimizerSpec::Kind optimizer = v1::OptimizerSpec::MOMENTUM) {
  v1::ModelSpec spec;
  spec.set_name("m");
  spec.set_seed(3);
  spec.set_slice_bytes(4096);
  spec.set_num_shards(1);
  spec.mutable_optimizer()->set_kind(optimizer);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_optimizer()->set_momentum(0.9f);
  spec.mutable_optimizer()->set_beta1(0.9f);
  spec.mutable_optimizer()->set_beta2(0.999f);
  spec.mutable_optimizer()->set_epsilon(1e-8f);
  spec.mutable_optimizer()->set_initial_accumulator_value(0.1f);
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

// `store` written through a Checkpointer and read back.
v1::ShardCheckpoint RoundTrip(ShardStore* store) {
  FaultFileSystem fs;
  Checkpointer checkpointer(store, &fs, kDir, 0, 3, absl::ZeroDuration(),
                            Clock::Real());
  auto path = checkpointer.Write();
  EXPECT_TRUE(path.ok()) << path.status();
  if (!path.ok()) return {};
  auto loaded = ReadCheckpointFile(&fs, *path);
  EXPECT_TRUE(loaded.ok()) << loaded.status();
  return loaded.ok() ? *std::move(loaded) : v1::ShardCheckpoint();
}

TEST(Checkpoint, RestoredStoreBehavesLikeTheOriginal) {
  ShardStore a(0, 1, 64 << 20);
  ASSERT_TRUE(a.Declare(Spec()).ok());
  PushAll(&a, Spec(), 1.0f);
  PushAll(&a, Spec(), -0.5f);
  const v1::ShardCheckpoint loaded = RoundTrip(&a);
  ShardStore b(0, 1, 64 << 20);
  ASSERT_TRUE(b.Restore(loaded).ok());
  // (That it then behaves exactly like `a`, optimizer state included, is
  // OptimizerStateTest's.)
  auto sb = b.Snapshot();
  ASSERT_TRUE(sb.ok());
  for (const auto& slice : sb->slices()) EXPECT_EQ(slice.version(), 2);
  // A second store cannot take a checkpoint over a declared model.
  EXPECT_EQ(b.Restore(loaded).code(), absl::StatusCode::kFailedPrecondition);
}

// Every optimizer's state (momentum; Adam's moments and step, which its
// bias correction reads; Adagrad's sums) comes back bit for bit: after a
// restore, ten more pushes give the very weights the original reaches.
class OptimizerStateTest
    : public ::testing::TestWithParam<v1::OptimizerSpec::Kind> {};

TEST_P(OptimizerStateTest, RestoredExactly) {
  const v1::ModelSpec spec = Spec(GetParam());
  ShardStore a(0, 1, 64 << 20);
  ASSERT_TRUE(a.Declare(spec).ok());
  for (int i = 0; i < 7; ++i) PushAll(&a, spec, 0.3f * (i % 3) - 0.2f);
  const v1::ShardCheckpoint loaded = RoundTrip(&a);
  ShardStore b(0, 1, 64 << 20);
  ASSERT_TRUE(b.Restore(loaded).ok());
  for (int i = 0; i < 10; ++i) {
    PushAll(&a, spec, 0.1f * i - 0.4f);
    PushAll(&b, spec, 0.1f * i - 0.4f);
  }
  auto sa = a.Snapshot();
  auto sb = b.Snapshot();
  ASSERT_TRUE(sa.ok() && sb.ok());
  ASSERT_EQ(sa->slices_size(), sb->slices_size());
  for (int i = 0; i < sa->slices_size(); ++i) {
    EXPECT_EQ(sa->slices(i).weights(), sb->slices(i).weights());
    EXPECT_EQ(sa->slices(i).slot1(), sb->slices(i).slot1());
    EXPECT_EQ(sa->slices(i).slot2(), sb->slices(i).slot2());
    EXPECT_EQ(sa->slices(i).optimizer_steps(), sb->slices(i).optimizer_steps());
    EXPECT_EQ(sb->slices(i).version(), 17);
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OptimizerStateTest,
                         ::testing::Values(v1::OptimizerSpec::SGD,
                                           v1::OptimizerSpec::MOMENTUM,
                                           v1::OptimizerSpec::ADAM,
                                           v1::OptimizerSpec::ADAGRAD));

TEST(Checkpoint, DamagedFilesAreRefusedByName) {
  FaultFileSystem fs;
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(Spec()).ok());
  auto snapshot = store.Snapshot();
  ASSERT_TRUE(snapshot.ok());
  const std::string path = CheckpointPath(kDir, 0, 1);
  ASSERT_TRUE(WriteCheckpointFile(&fs, path, *snapshot).ok());
  const std::string good = *fs.ReadFile(path);

  fs.WriteFileForTest(path, good.substr(0, good.size() - 10));
  auto r = ReadCheckpointFile(&fs, path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("truncated"), absl::string_view::npos);
  EXPECT_NE(r.status().message().find(path), absl::string_view::npos);

  std::string flipped = good;
  flipped[flipped.size() / 2] ^= 0x40;
  fs.WriteFileForTest(path, flipped);
  r = ReadCheckpointFile(&fs, path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(r.status().message().find("checksum"), absl::string_view::npos);

  fs.WriteFileForTest(path, "NOTACKPT" + good.substr(8));
  r = ReadCheckpointFile(&fs, path);
  EXPECT_NE(r.status().message().find("bad magic"), absl::string_view::npos);

  fs.WriteFileForTest(path, good.substr(0, 5));
  r = ReadCheckpointFile(&fs, path);
  EXPECT_NE(r.status().message().find("truncated header"),
            absl::string_view::npos);

  EXPECT_EQ(
      ReadCheckpointFile(&fs, std::string(kDir) + "/none.ckpt").status().code(),
      absl::StatusCode::kNotFound);
}

TEST(Checkpoint, NewestValidIsLoadedAndOldOnesPruned) {
  FaultFileSystem fs;
  const std::string dir = kDir;
  ShardStore store(0, 1, 64 << 20);
  ASSERT_TRUE(store.Declare(Spec()).ok());
  auto v0 = store.Snapshot();
  PushAll(&store, Spec(), 1.0f);
  auto v1 = store.Snapshot();
  ASSERT_TRUE(v0.ok() && v1.ok());
  ASSERT_TRUE(WriteCheckpointFile(&fs, CheckpointPath(dir, 0, 100), *v0).ok());
  ASSERT_TRUE(WriteCheckpointFile(&fs, CheckpointPath(dir, 0, 200), *v1).ok());
  // The newest is cut short by a crash: the one before it is used.
  fs.WriteFileForTest(CheckpointPath(dir, 0, 300), "ASYNCPSC");
  std::vector<std::string> skipped;
  auto newest = LoadNewestCheckpoint(&fs, dir, 0, &skipped);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->slices(0).version(), 1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find("300"), std::string::npos) << skipped[0];
  EXPECT_EQ(LoadNewestCheckpoint(&fs, dir, 7, nullptr).status().code(),
            absl::StatusCode::kNotFound);
  PruneCheckpoints(&fs, dir, 0, 1);
  skipped.clear();
  EXPECT_EQ(LoadNewestCheckpoint(&fs, dir, 0, &skipped).status().code(),
            absl::StatusCode::kNotFound);  // Only the broken newest is left.
}

// Writes a checkpoint of `version` pushes' worth of state at time `t`, and
// returns the status of writing one more at time `t + 1` under a fault.
class CheckpointFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(store_.Declare(Spec()).ok());
    PushAll(&store_, Spec(), 1.0f);
    auto good = store_.Snapshot();
    ASSERT_TRUE(good.ok());
    ASSERT_TRUE(
        WriteCheckpointFile(&fs_, CheckpointPath(kDir, 0, 100), *good).ok());
    PushAll(&store_, Spec(), 1.0f);  // The state the failing write holds.
    auto next = store_.Snapshot();
    ASSERT_TRUE(next.ok());
    next_ = *next;
  }

  absl::Status WriteNext() {
    return WriteCheckpointFile(&fs_, CheckpointPath(kDir, 0, 200), next_);
  }

  // The newest valid checkpoint's version, which must be the good one's (1)
  // or the new one's (2), never an error.
  int64_t NewestVersion() {
    auto newest = LoadNewestCheckpoint(&fs_, kDir, 0, nullptr);
    EXPECT_TRUE(newest.ok()) << newest.status();
    return newest.ok() ? newest->slices(0).version() : -1;
  }

  FaultFileSystem fs_;
  ShardStore store_{0, 1, 64 << 20};
  v1::ShardCheckpoint next_;
};

TEST_F(CheckpointFaultTest, FullDiskFailsTheWriteAndKeepsTheOldOne) {
  fs_.SetSpaceLeft(100);  // A short write, then ENOSPC.
  absl::Status s = WriteNext();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("No space"), absl::string_view::npos) << s;
  EXPECT_FALSE(fs_.Exists(CheckpointPath(kDir, 0, 200)));
  EXPECT_FALSE(fs_.Exists(CheckpointPath(kDir, 0, 200) + ".tmp"));
  EXPECT_EQ(NewestVersion(), 1);
  fs_.SetSpaceLeft(-1);  // Space freed: the next write goes through.
  EXPECT_TRUE(WriteNext().ok());
  EXPECT_EQ(NewestVersion(), 2);
}

TEST_F(CheckpointFaultTest, FailedFsyncFailsTheWriteAndKeepsTheOldOne) {
  fs_.SetFailSync(true);
  absl::Status s = WriteNext();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_NE(s.message().find("fsync"), absl::string_view::npos) << s;
  EXPECT_FALSE(fs_.Exists(CheckpointPath(kDir, 0, 200)));
  EXPECT_EQ(NewestVersion(), 1);
}

TEST_F(CheckpointFaultTest, CrashBetweenWriteAndRenameLeavesTheOldOne) {
  fs_.SetFailRename(true);  // The process dies just before the rename...
  EXPECT_FALSE(WriteNext().ok());
  fs_.Crash();  // ...and the machine with it.
  fs_.SetFailRename(false);
  EXPECT_FALSE(fs_.Exists(CheckpointPath(kDir, 0, 200)));
  EXPECT_EQ(NewestVersion(), 1);
}

TEST_F(CheckpointFaultTest, PowerCutAfterAWriteKeepsTheNewOne) {
  ASSERT_TRUE(WriteNext().ok());
  fs_.Crash();  // Data and rename were made durable before Write returned.
  EXPECT_EQ(NewestVersion(), 2);
}

TEST_F(CheckpointFaultTest, CheckpointerReportsTheFaultAndPrunesNothing) {
  Checkpointer checkpointer(&store_, &fs_, kDir, 0, 1, absl::ZeroDuration(),
                            Clock::Real());
  fs_.SetFailSync(true);
  EXPECT_FALSE(checkpointer.Write().ok());
  // keep = 1, but the only good file stays since the new one failed.
  EXPECT_EQ(NewestVersion(), 1);
  fs_.SetFailSync(false);
  auto path = checkpointer.Write();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_EQ(NewestVersion(), 2);
  EXPECT_EQ(fs_.Paths(), std::vector<std::string>{*path});  // Pruned to 1.
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
