#include "common/model_spec.h"

#include <vector>

#include "common/initializer.h"
#include "gtest/gtest.h"

namespace asyncps {
namespace {

v1::ModelSpec Valid() {
  v1::ModelSpec spec;
  spec.set_name("mlp");
  spec.set_seed(7);
  spec.set_slice_bytes(4096);
  spec.set_num_shards(2);
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w0");
  t->add_shape(4);
  t->add_shape(3);
  t->set_dtype(v1::DTYPE_F32);
  t->mutable_init()->set_kind(v1::Initializer::GLOROT_UNIFORM);
  t->mutable_init()->set_fan_in(4);
  t->mutable_init()->set_fan_out(3);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  return spec;
}

TEST(ModelSpec, ValidSpecPasses) {
  EXPECT_TRUE(ValidateModelSpec(Valid()).ok());
}

TEST(ModelSpec, DuplicateAndBadNamesRejected) {
  v1::ModelSpec spec = Valid();
  *spec.add_tensors() = spec.tensors(0);
  absl::Status s = ValidateModelSpec(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("declared twice"), absl::string_view::npos) << s;
  spec = Valid();
  spec.mutable_tensors(0)->set_name("w 0");
  EXPECT_EQ(ValidateModelSpec(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelSpec, BadInitializerAndOptimizerRejected) {
  v1::ModelSpec spec = Valid();
  spec.mutable_tensors(0)->mutable_init()->set_fan_in(0);
  EXPECT_EQ(ValidateModelSpec(spec).code(), absl::StatusCode::kInvalidArgument);
  spec = Valid();
  spec.mutable_optimizer()->set_learning_rate(-1);
  EXPECT_EQ(ValidateModelSpec(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelSpec, HugeModelRejected) {
  v1::ModelSpec spec = Valid();
  spec.mutable_tensors(0)->set_shape(0, int64_t{1} << 40);
  EXPECT_EQ(ValidateModelSpec(spec).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelSpec, DifferenceNamesTheField) {
  v1::ModelSpec a = Valid(), b = Valid();
  EXPECT_EQ(DescribeSpecDifference(a, b), "");
  b.mutable_optimizer()->set_learning_rate(0.2f);
  EXPECT_NE(DescribeSpecDifference(a, b).find("learning_rate"),
            std::string::npos)
      << DescribeSpecDifference(a, b);
}

TEST(Initializer, IndependentOfSliceBoundaries) {
  v1::Initializer init;
  init.set_kind(v1::Initializer::NORMAL);
  init.set_stddev(1.0f);
  std::vector<float> whole(100), a(37), b(63);
  FillInitial(init, 42, "w", 0, absl::MakeSpan(whole));
  FillInitial(init, 42, "w", 0, absl::MakeSpan(a));
  FillInitial(init, 42, "w", 37, absl::MakeSpan(b));
  for (int i = 0; i < 37; ++i) EXPECT_EQ(whole[i], a[i]);
  for (int i = 0; i < 63; ++i) EXPECT_EQ(whole[37 + i], b[i]);
  // Different seed or name, different numbers.
  std::vector<float> other(100);
  FillInitial(init, 43, "w", 0, absl::MakeSpan(other));
  EXPECT_NE(whole, other);
}

TEST(Initializer, GlorotStaysInRangeWithSensibleSpread) {
  v1::Initializer init;
  init.set_kind(v1::Initializer::GLOROT_UNIFORM);
  init.set_fan_in(100);
  init.set_fan_out(50);
  std::vector<float> w(20000);
  FillInitial(init, 1, "w", 0, absl::MakeSpan(w));
  const float a = std::sqrt(6.0f / 150.0f);
  double sum = 0, sq = 0;
  for (float x : w) {
    ASSERT_GE(x, -a);
    ASSERT_LE(x, a);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / w.size(), 0.0, 0.01);
  EXPECT_NEAR(sq / w.size(), a * a / 3, 0.01);  // Var of U[-a, a].
}

}  // namespace
}  // namespace asyncps
