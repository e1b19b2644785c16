// The model most server unit tests use: one tensor "w" of 4 elements, all
// 10, in one slice on one shard, plain SGD with learning rate 1 (so a
// gradient g moves every weight by exactly -g).
#ifndef ASYNCPS_TESTS_SERVER_SMALL_MODEL_H_
#define ASYNCPS_TESTS_SERVER_SMALL_MODEL_H_

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/tensor_bytes.h"
#include "proto/asyncps.pb.h"

namespace asyncps::testing {

inline v1::ModelSpec SmallModel() {
  v1::ModelSpec spec;
  spec.set_name("m");
  spec.set_seed(1);
  spec.set_slice_bytes(1 << 20);
  spec.set_num_shards(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::SGD);
  spec.mutable_optimizer()->set_learning_rate(1.0f);
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(4);
  t->set_dtype(v1::DTYPE_F32);
  t->mutable_init()->set_kind(v1::Initializer::CONSTANT);
  t->mutable_init()->set_value(10.0f);
  return spec;
}

// The key of SmallModel's one slice.
inline v1::SliceKey SmallModelKey() {
  v1::SliceKey key;
  key.set_tensor("w");
  key.set_count(4);
  return key;
}

// SmallModel's slice holding `value` everywhere, as f32 payload.
inline v1::SliceData SmallModelSlice(float value, int64_t version = 0) {
  v1::SliceData d;
  *d.mutable_key() = SmallModelKey();
  d.set_dtype(v1::DTYPE_F32);
  d.set_version(version);
  EncodeF32(std::vector<float>(4, value), d.mutable_data());
  return d;
}

// A push of gradient `value` everywhere, computed from `version`.
inline v1::PushRequest SmallModelPush(float value, int64_t version = 0,
                                      int rank = 0, int64_t clock = 1) {
  v1::PushRequest req;
  req.set_rank(rank);
  req.set_clock(clock);
  *req.add_gradients() = SmallModelSlice(value, version);
  return req;
}

// A model whose state spans many chunks of a tiny chunk size: 3000
// weights in slices of 1024, Adam (so 12 KiB of state per slice).
inline v1::ModelSpec ChunkyModel() {
  v1::ModelSpec spec;
  spec.set_name("chunky");
  spec.set_seed(3);
  spec.set_slice_bytes(4096);
  spec.set_num_shards(1);
  spec.mutable_optimizer()->set_kind(v1::OptimizerSpec::ADAM);
  spec.mutable_optimizer()->set_learning_rate(0.1f);
  spec.mutable_optimizer()->set_beta1(0.9f);
  spec.mutable_optimizer()->set_beta2(0.999f);
  spec.mutable_optimizer()->set_epsilon(1e-8f);
  v1::TensorSpec* t = spec.add_tensors();
  t->set_name("w");
  t->add_shape(3000);
  t->set_dtype(v1::DTYPE_F32);
  t->mutable_init()->set_kind(v1::Initializer::NORMAL);
  t->mutable_init()->set_stddev(1.0f);
  return spec;
}

// A push of gradient `value` to every slice of ChunkyModel().
inline v1::PushRequest ChunkyModelPush(float value) {
  v1::PushRequest req;
  for (int begin = 0, index = 0; begin < 3000; begin += 1024, ++index) {
    v1::SliceData* d = req.add_gradients();
    d->mutable_key()->set_tensor("w");
    d->mutable_key()->set_index(index);
    d->mutable_key()->set_begin(begin);
    d->mutable_key()->set_count(std::min(1024, 3000 - begin));
    d->set_dtype(v1::DTYPE_F32);
    EncodeF32(std::vector<float>(d->key().count(), value), d->mutable_data());
  }
  return req;
}

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_SERVER_SMALL_MODEL_H_
