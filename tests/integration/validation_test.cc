// Every kind of bad request to a shard gets a precise status and changes no
// weight: the whole server (service, store, consistency) in-process, reached
// through gRPC's in-process transport. What good requests get back:
// shard_answers_test.cc.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <limits>

#include "absl/synchronization/notification.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/integration/test_cluster.h"
#include "tests/integration/validation_fixture.h"

namespace asyncps::testing {
namespace {

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
