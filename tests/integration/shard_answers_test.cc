// What good requests get from a shard, the whole server in-process through
// gRPC's in-process transport: server reflection lists the services, the
// fused PushPull answers the weights its push produced, and 16-bit
// gradients and pulls carry exactly the values their dtype holds.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/tensor_bytes.h"
#include "common/wire_dtype.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "tests/integration/validation_fixture.h"

namespace asyncps::testing {
namespace {

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

}  // namespace
}  // namespace asyncps::testing
