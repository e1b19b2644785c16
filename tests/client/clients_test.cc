// The clients over a ShardCaller, against in-process shards: PsClient's
// per-tensor wire dtypes (checked, and requests split by dtype),
// AdminClient's stats of every shard, RendezvousClient's store (written by
// the job's workers only) and its waiting.
#include <memory>
#include <string>
#include <vector>

#include "client/admin_client.h"
#include "client/ps_client.h"
#include "client/rendezvous_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"

namespace asyncps::testing {
namespace {

PsClientOptions Options(const LocalShards& shards) {
  PsClientOptions o;
  o.servers = shards.addresses;
  o.retry_for = absl::Seconds(5);
  return o;
}

// Two tensors of 8 elements in 16-byte slices over both shards, weights 1.
v1::ModelSpec Spec() {
  v1::ModelSpec spec;
  spec.set_name("m");
  spec.set_num_shards(2);
  spec.set_slice_bytes(16);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  for (const char* name : {"a", "b"}) {
    v1::TensorSpec* t = spec.add_tensors();
    t->set_name(name);
    t->add_shape(8);
    t->set_dtype(v1::DTYPE_F32);
    t->mutable_init()->set_kind(v1::Initializer::CONSTANT);
    t->mutable_init()->set_value(1.0f);
  }
  return spec;
}

TEST(PsClient, EachTensorInItsWireDtypeOnTheSameShards) {
  auto shards = StartLocalShards(2);
  ASSERT_TRUE(shards.ok()) << shards.status();
  auto client = PsClient::Create(Options(*shards));
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->Join(0, 1).ok());
  ASSERT_TRUE((*client)->DeclareModel(Spec()).ok());
  EXPECT_EQ((*client)->WireDtype(1), v1::DTYPE_F32);
  EXPECT_EQ((*client)->SetWireDtypes({v1::DTYPE_BF16}).code(),
            absl::StatusCode::kInvalidArgument);
  absl::Status bad = (*client)->SetWireDtypes({v1::DTYPE_F32, v1::DType(9)});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("'b'"), std::string::npos) << bad;
  ASSERT_TRUE((*client)->SetWireDtypes({v1::DTYPE_F32, v1::DTYPE_BF16}).ok());
  // 1 - 2^-10 * 1: exact in f32, 1.0 in bf16 (both tensors on both shards,
  // so each shard's push and pull are two requests, one per dtype).
  const float g = 1.0f / 1024;
  std::vector<std::vector<float>> grads = {std::vector<float>(8, g),
                                           std::vector<float>(8, g)};
  std::vector<std::vector<float>> w(2, std::vector<float>(8));
  std::vector<SliceVersion> versions((*client)->partition().slices().size()),
      after;
  ASSERT_TRUE((*client)
                  ->PushPull({0, 1}, grads, versions, 0, 1, &w, &after, nullptr)
                  .ok());
  EXPECT_EQ(w[0], std::vector<float>(8, 1.0f - g));  // f32.
  // bf16's gradient rounds 2^-10 exactly, and the weight 1 - 2^-10 rounds
  // to 1 on the way back.
  EXPECT_EQ(w[1], std::vector<float>(8, 1.0f));
  // A new adoption resets the wire dtypes.
  ASSERT_TRUE((*client)->UseModel(Spec()).ok());
  EXPECT_EQ((*client)->WireDtype(1), v1::DTYPE_F32);
}

TEST(AdminClient, StatsOfEveryShardInOrder) {
  auto shards = StartLocalShards(2);
  ASSERT_TRUE(shards.ok()) << shards.status();
  auto client = PsClient::Create(Options(*shards));
  ASSERT_TRUE(client.ok());
  AdminClient admin((*client)->caller());
  auto all = admin.StatsAll();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].shard(), 0u);
  EXPECT_EQ((*all)[1].shard(), 1u);
  auto one = admin.Stats(1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->shard(), 1u);
  // No checkpoint directory: a checkpoint on request is refused, named.
  auto path = admin.Checkpoint(0);
  EXPECT_FALSE(path.ok());
}

TEST(RendezvousClient, SetGetAndWaitingForAKey) {
  auto shards = StartLocalShards(1);
  ASSERT_TRUE(shards.ok()) << shards.status();
  auto client = PsClient::Create(Options(*shards));
  ASSERT_TRUE(client.ok());
  // Only a registered worker of the job writes the store; anyone reads.
  RendezvousClient a((*client)->caller()), b((*client)->caller());
  const absl::Status stranger = a.StoreSet("ring/0", "host:666");
  EXPECT_EQ(stranger.code(), absl::StatusCode::kPermissionDenied) << stranger;
  EXPECT_NE(stranger.message().find("only a registered worker"),
            std::string::npos)
      << stranger;
  ASSERT_TRUE((*client)->Join(0, 1).ok());
  ASSERT_TRUE(a.StoreSet("ring/0", "host:1").ok());
  auto got = b.StoreGet("ring/0", absl::Seconds(5));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "host:1");
  auto missing = b.StoreGet("ring/1", absl::Milliseconds(50));
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded)
      << missing.status();
}

}  // namespace
}  // namespace asyncps::testing
