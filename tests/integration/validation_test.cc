// Every kind of bad request to a shard gets a precise status and changes no
// weight: the whole server (service, store, consistency) in-process, reached
// through gRPC's in-process transport.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <limits>

#include "absl/synchronization/notification.h"
#include "common/partitioner.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

constexpr int64_t kMaxMessage = 1 << 20;

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardServerConfig config;
    config.host = "";  // In-process only: no socket, no port.
    config.shard = 0;
    config.num_shards = 2;
    config.max_message_bytes = kMaxMessage;
    auto server = ShardServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = server_->InProcessChannel();
    stub_ = v1::ParameterServer::NewStub(channel_);
    spec_ = ConstantSpec({{40, 30}, {7}}, 2, 0.5f, 0.1f, 256);
    auto p = Partition::Create(spec_);
    ASSERT_TRUE(p.ok());
    partition_ = *std::move(p);
    for (size_t i = 0; i < partition_.slices().size(); ++i) {
      (partition_.slices()[i].shard == 0 ? mine_ : theirs_).push_back(i);
    }
    ASSERT_GE(mine_.size(), 2u);
    ASSERT_GE(theirs_.size(), 1u);
    // The test's calls act as rank 0 of a one-worker job, registered.
    v1::RegisterRequest join;
    join.set_rank(0);
    join.set_num_workers(1);
    v1::RegisterResponse joined;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Register(&ctx, join, &joined).ok());
    secret_ = joined.secret();
  }

  void Declare() {
    v1::DeclareModelRequest req;
    *req.mutable_spec() = spec_;
    req.set_secret(secret_);
    v1::DeclareModelResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->DeclareModel(&ctx, req, &resp).ok());
    ASSERT_TRUE(resp.created());
  }

  v1::SliceKey Key(int i) const {
    const SliceInfo& s = partition_.slices()[i];
    v1::SliceKey key;
    key.set_tensor(spec_.tensors(s.tensor).name());
    key.set_index(s.index);
    key.set_begin(s.begin);
    key.set_count(s.count);
    return key;
  }

  // A well-formed gradient of all `value` for slice i.
  v1::SliceData Grad(int i, float value = 1.0f) const {
    v1::SliceData d;
    *d.mutable_key() = Key(i);
    d.set_dtype(v1::DTYPE_F32);
    std::vector<float> g(partition_.slices()[i].count, value);
    EncodeF32(g, d.mutable_data());
    return d;
  }

  grpc::Status Push(const std::vector<v1::SliceData>& grads) {
    v1::PushRequest req;
    req.set_secret(secret_);
    for (const auto& g : grads) *req.add_gradients() = g;
    v1::PushResponse resp;
    grpc::ClientContext ctx;
    return stub_->Push(&ctx, req, &resp);
  }

  grpc::Status Pull(const std::vector<v1::SliceKey>& keys,
                    v1::PullResponse* resp) {
    v1::PullRequest req;
    req.set_secret(secret_);
    for (const auto& k : keys) *req.add_slices() = k;
    grpc::ClientContext ctx;
    return stub_->Pull(&ctx, req, resp);
  }

  // Every slice of shard 0 still holds its initial value at version 0.
  void ExpectUntouched() {
    std::vector<v1::SliceKey> keys;
    for (int i : mine_) keys.push_back(Key(i));
    v1::PullResponse resp;
    ASSERT_TRUE(Pull(keys, &resp).ok());
    for (const auto& d : resp.slices()) {
      EXPECT_EQ(d.version(), 0) << d.key().tensor() << "#" << d.key().index();
      std::vector<float> w(d.data().size() / 4);
      DecodeF32(d.data(), absl::MakeSpan(w));
      for (float x : w) ASSERT_EQ(x, 0.5f);
    }
  }

  void ExpectRejected(const grpc::Status& s, grpc::StatusCode code,
                      absl::string_view words) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(std::string(words)), std::string::npos)
        << "message '" << s.error_message() << "' lacks '" << words << "'";
    ExpectUntouched();
  }

  std::unique_ptr<ShardServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  v1::ModelSpec spec_;
  Partition partition_;
  std::vector<int> mine_, theirs_;
  uint64_t secret_ = 0;  // Rank 0's registration.
};

TEST_F(ValidationTest, PushBeforeDeclareIsFailedPrecondition) {
  EXPECT_EQ(Push({Grad(mine_[0])}).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::PullResponse resp;
  grpc::Status s = Pull({Key(mine_[0])}, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(s.error_message().find("before any model"), std::string::npos);
}

TEST_F(ValidationTest, DeclareIsIdempotentButRefusesADifferentSpec) {
  Declare();
  v1::DeclareModelRequest req;
  *req.mutable_spec() = spec_;
  v1::DeclareModelResponse resp;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->DeclareModel(&ctx, req, &resp).ok());
    EXPECT_FALSE(resp.created());
  }
  req.mutable_spec()->mutable_optimizer()->set_learning_rate(0.2f);
  {
    grpc::ClientContext ctx;
    grpc::Status s = stub_->DeclareModel(&ctx, req, &resp);
    ExpectRejected(s, grpc::StatusCode::FAILED_PRECONDITION, "learning_rate");
  }
  req.mutable_spec()->set_num_shards(3);
  {
    grpc::ClientContext ctx;
    ExpectRejected(stub_->DeclareModel(&ctx, req, &resp),
                   grpc::StatusCode::FAILED_PRECONDITION, "--num_shards=2");
  }
  req.mutable_spec()->mutable_tensors(0)->set_shape(0, -4);
  {
    grpc::ClientContext ctx;
    ExpectRejected(stub_->DeclareModel(&ctx, req, &resp),
                   grpc::StatusCode::INVALID_ARGUMENT, "dimension -4");
  }
}

TEST_F(ValidationTest, UnknownTensorIsNotFound) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.mutable_key()->set_tensor("nope");
  ExpectRejected(Push({g}), grpc::StatusCode::NOT_FOUND,
                 "unknown tensor 'nope'");
  v1::PullResponse resp;
  EXPECT_EQ(Pull({g.key()}, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ValidationTest, UnknownSliceIsNotFound) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.mutable_key()->set_index(999);
  ExpectRejected(Push({g}), grpc::StatusCode::NOT_FOUND, "no slice 999");
}

TEST_F(ValidationTest, SliceOfAnotherShardIsNotFound) {
  Declare();
  ExpectRejected(Push({Grad(theirs_[0])}), grpc::StatusCode::NOT_FOUND,
                 "lives on shard 1");
}

TEST_F(ValidationTest, SliceOutOfBoundsIsInvalidArgument) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.mutable_key()->set_begin(1199);
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT,
                 "out of bounds");
  v1::PullResponse resp;
  EXPECT_EQ(Pull({g.key()}, &resp).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ValidationTest, RangeThatDisagreesWithThePartitionIsInvalidArgument) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.mutable_key()->set_count(g.key().count() - 1);
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT,
                 "disagree about the partition");
}

TEST_F(ValidationTest, WrongByteLengthIsInvalidArgument) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.mutable_data()->resize(g.data().size() - 3);
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT, "bytes");
}

TEST_F(ValidationTest, UnknownOrUnsupportedDtypeIsInvalidArgument) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.set_dtype(static_cast<v1::DType>(7));
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT,
                 "unknown dtype 7");
  g.set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT,
                 "DTYPE_UNSPECIFIED");
  // bf16 is accepted, but f32-sized data is not bf16 data.
  g.set_dtype(v1::DTYPE_BF16);
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT,
                 "DTYPE_BF16 elements need");
}

TEST_F(ValidationTest, NanOrInfGradientIsInvalidArgument) {
  Declare();
  // The first slice is fine; the NaN in the second must stop both.
  v1::SliceData good = Grad(mine_[0]);
  v1::SliceData bad = Grad(mine_[1]);
  std::vector<float> g(partition_.slices()[mine_[1]].count, 1.0f);
  g[3] = std::numeric_limits<float>::quiet_NaN();
  EncodeF32(g, bad.mutable_data());
  ExpectRejected(Push({good, bad}), grpc::StatusCode::INVALID_ARGUMENT, "NaN");
  g[3] = std::numeric_limits<float>::infinity();
  EncodeF32(g, bad.mutable_data());
  ExpectRejected(Push({good, bad}), grpc::StatusCode::INVALID_ARGUMENT, "Inf");
}

TEST_F(ValidationTest, VersionFromTheFutureIsInvalidArgument) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.set_version(5);
  ExpectRejected(Push({g}), grpc::StatusCode::INVALID_ARGUMENT,
                 "only at version 0");
}

TEST_F(ValidationTest, SliceTwiceInOnePushIsInvalidArgument) {
  Declare();
  ExpectRejected(Push({Grad(mine_[0]), Grad(mine_[0])}),
                 grpc::StatusCode::INVALID_ARGUMENT, "twice");
}

TEST_F(ValidationTest, MessageOverTheLimitIsResourceExhausted) {
  Declare();
  v1::SliceData g = Grad(mine_[0]);
  g.mutable_data()->assign(kMaxMessage + 16, '\0');
  grpc::Status s = Push({g});
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  ExpectUntouched();
}

TEST_F(ValidationTest, ModelTooBigForTheShardIsResourceExhausted) {
  // 2 shards of a 64 GB model: far over the default 4 GiB per shard. The
  // server must refuse, not try to allocate it.
  v1::ModelSpec huge =
      ConstantSpec({{1 << 20, 1 << 14}}, 2, 0.0f, 0.1f, 4 << 20);
  v1::DeclareModelRequest req;
  *req.mutable_spec() = huge;
  req.set_secret(secret_);
  v1::DeclareModelResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->DeclareModel(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << s.error_message();
  EXPECT_NE(s.error_message().find("--max_shard_bytes"), std::string::npos);
  Declare();  // The shard is still empty and takes the real model.
  ExpectUntouched();
}

TEST_F(ValidationTest, GarbageBytesDoNotCrashTheServer) {
  Declare();
  grpc::GenericStub generic(channel_);
  const std::string junk = "\xff\xff\xff\xff\x0f garbage that is not a proto";
  grpc::Slice slice(junk);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(&ctx, "/asyncps.v1.ParameterServer/Push",
                    grpc::StubOptions(), &request, &response,
                    [&](grpc::Status s) {
                      status = std::move(s);
                      done.Notify();
                    });
  done.WaitForNotification();
  EXPECT_FALSE(status.ok());
  ExpectUntouched();  // And the server still answers.
}

// Server reflection answers gRPC's tools: asked to list the services (a
// ServerReflectionRequest with list_services, field 7, sent as the one
// message of its stream), it names ours and the health service.
TEST_F(ValidationTest, ReflectionListsTheServices) {
  grpc::GenericStub generic(channel_);
  const std::string list_services("\x3a\x00", 2);
  grpc::Slice slice(list_services);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext ctx;
  absl::Notification done;
  grpc::Status status;
  generic.UnaryCall(
      &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
      grpc::StubOptions(), &request, &response, [&](grpc::Status s) {
        status = std::move(s);
        done.Notify();
      });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const auto& s : slices) bytes += std::string(s.begin(), s.end());
  EXPECT_NE(bytes.find("asyncps.v1.ParameterServer"), std::string::npos);
  EXPECT_NE(bytes.find("grpc.health.v1.Health"), std::string::npos);
}

// The fused call: the weights it answers are those a Push and then a Pull
// would give, bit for bit.
TEST_F(ValidationTest, PushPullAnswersTheWeightsItsPushProduced) {
  Declare();
  v1::PushPullRequest req;
  req.mutable_push()->set_rank(0);
  req.mutable_push()->set_secret(secret_);
  req.mutable_push()->set_clock(1);
  *req.mutable_push()->add_gradients() = Grad(mine_[0], 2.0f);
  *req.mutable_push()->add_gradients() = Grad(mine_[1], -1.0f);
  v1::PushPullResponse resp;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->PushPull(&ctx, req, &resp).ok());
  ASSERT_EQ(resp.push().versions_size(), 2);
  ASSERT_EQ(resp.pull().slices_size(), 2);
  v1::PullResponse pulled;
  ASSERT_TRUE(Pull({Key(mine_[0]), Key(mine_[1])}, &pulled).ok());
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(resp.pull().slices(k).data(), pulled.slices(k).data());
    EXPECT_EQ(resp.pull().slices(k).version(), 1);
    EXPECT_EQ(resp.pull().slices(k).dtype(), v1::DTYPE_F32);
  }
  std::vector<float> w(partition_.slices()[mine_[0]].count);
  DecodeF32(resp.pull().slices(0).data(), absl::MakeSpan(w));
  EXPECT_EQ(w[0], 0.5f - 0.1f * 2.0f);
}

TEST_F(ValidationTest, PushPullWithABadGradientAppliesNothing) {
  Declare();
  v1::PushPullRequest req;
  req.mutable_push()->set_secret(secret_);
  *req.mutable_push()->add_gradients() = Grad(mine_[0], 1.0f);
  *req.mutable_push()->add_gradients() =
      Grad(mine_[1], std::numeric_limits<float>::quiet_NaN());
  v1::PushPullResponse resp;
  grpc::ClientContext ctx;
  ExpectRejected(stub_->PushPull(&ctx, req, &resp),
                 grpc::StatusCode::INVALID_ARGUMENT, "NaN");
  EXPECT_EQ(resp.pull().slices_size(), 0);
}

// 16-bit gradients are widened exactly: a value bf16 and f16 hold exactly
// moves the weights as the same f32 gradient does.
TEST_F(ValidationTest, SixteenBitGradientsApplyTheirExactValues) {
  Declare();
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_F16}) {
    v1::SliceData g = Grad(mine_[0], 0.25f);
    g.set_dtype(dtype);
    std::vector<float> values(partition_.slices()[mine_[0]].count, 0.25f);
    EncodeTensor(dtype, values, g.mutable_data());
    ASSERT_TRUE(Push({g}).ok()) << v1::DType_Name(dtype);
  }
  v1::PullResponse resp;
  ASSERT_TRUE(Pull({Key(mine_[0])}, &resp).ok());
  std::vector<float> w(partition_.slices()[mine_[0]].count);
  DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
  const float once = 0.5f - 0.1f * 0.25f;
  for (float x : w) ASSERT_EQ(x, once - 0.1f * 0.25f);
}

TEST_F(ValidationTest, PullInSixteenBitsRoundsTheWeightsToNearest) {
  Declare();
  ASSERT_TRUE(Push({Grad(mine_[0], 1.0f / 3.0f)}).ok());
  v1::PullResponse exact;
  ASSERT_TRUE(Pull({Key(mine_[0])}, &exact).ok());
  const size_t n = partition_.slices()[mine_[0]].count;
  std::vector<float> w(n);
  DecodeF32(exact.slices(0).data(), absl::MakeSpan(w));
  for (v1::DType dtype : {v1::DTYPE_BF16, v1::DTYPE_F16}) {
    v1::PullRequest req;
    *req.add_slices() = Key(mine_[0]);
    req.set_dtype(dtype);
    req.set_secret(secret_);
    v1::PullResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Pull(&ctx, req, &resp).ok());
    ASSERT_EQ(resp.slices(0).dtype(), dtype);
    ASSERT_EQ(resp.slices(0).data().size(), n * 2);
    std::vector<float> got(n);
    DecodeTensor(dtype, resp.slices(0).data(), absl::MakeSpan(got));
    std::string want;
    EncodeTensor(dtype, w, &want);
    EXPECT_EQ(resp.slices(0).data(), want) << v1::DType_Name(dtype);
    EXPECT_NEAR(got[0], w[0], std::abs(w[0]) / 256) << v1::DType_Name(dtype);
  }
  v1::PullRequest bad;
  *bad.add_slices() = Key(mine_[0]);
  bad.set_secret(secret_);
  bad.set_dtype(static_cast<v1::DType>(9));
  v1::PullResponse resp;
  grpc::ClientContext ctx;
  grpc::Status s = stub_->Pull(&ctx, bad, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("unknown dtype 9"), std::string::npos)
      << s.error_message();
}

TEST_F(ValidationTest, GoodPushAfterRejectionsApplies) {
  Declare();
  ASSERT_TRUE(Push({Grad(mine_[0], 2.0f)}).ok());
  v1::PullResponse resp;
  ASSERT_TRUE(Pull({Key(mine_[0])}, &resp).ok());
  EXPECT_EQ(resp.slices(0).version(), 1);
  std::vector<float> w(resp.slices(0).data().size() / 4);
  DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
  EXPECT_FLOAT_EQ(w[0], 0.5f - 0.1f * 2.0f);
}

}  // namespace
}  // namespace asyncps::testing
