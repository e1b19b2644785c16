// What the EmbeddingTable tests share: a table's spec (dim 4, uniform
// initial rows, the optimizer given), and its rows pulled.
#ifndef ASYNCPS_TESTS_SERVER_EMBEDDING_TABLE_FIXTURE_H_
#define ASYNCPS_TESTS_SERVER_EMBEDDING_TABLE_FIXTURE_H_

#include <vector>

#include "gtest/gtest.h"
#include "server/embedding_table.h"

namespace asyncps {

inline v1::EmbeddingSpec Spec(v1::OptimizerSpec::Kind kind,
                              int64_t num_rows = 0, int64_t max_rows = 0) {
  v1::EmbeddingSpec s;
  s.set_name("user_id");
  s.set_dim(4);
  s.set_num_rows(num_rows);
  s.set_max_rows_per_shard(max_rows);
  s.set_seed(7);
  s.mutable_init()->set_kind(v1::Initializer::UNIFORM);
  s.mutable_init()->set_low(-0.5f);
  s.mutable_init()->set_high(0.5f);
  v1::OptimizerSpec* o = s.mutable_optimizer();
  o->set_kind(kind);
  o->set_learning_rate(0.1f);
  o->set_epsilon(1e-8f);
  o->set_beta1(0.9f);
  o->set_beta2(0.999f);
  o->set_initial_accumulator_value(0.1f);
  EXPECT_TRUE(ValidateEmbedding(s).ok()) << ValidateEmbedding(s);
  return s;
}

inline std::vector<float> Rows(EmbeddingTable* t,
                               const std::vector<int64_t>& ids) {
  std::vector<float> out(ids.size() * 4);
  EXPECT_TRUE(t->Pull(ids, absl::MakeSpan(out)).ok());
  return out;
}

// Row `k` of `rows` (dim 4).
inline std::vector<float> Row(const std::vector<float>& rows, size_t k) {
  return {rows.begin() + k * 4, rows.begin() + k * 4 + 4};
}

}  // namespace asyncps

#endif  // ASYNCPS_TESTS_SERVER_EMBEDDING_TABLE_FIXTURE_H_
