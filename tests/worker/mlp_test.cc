// The MLP's backward pass against central finite differences of its loss.
#include "worker/model/mlp.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"
#include "worker/cpu/cpu_backend.h"

namespace asyncps {
namespace {

TEST(Mlp, BackwardMatchesFiniteDifferences) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  const std::vector<int> layers = {6, 5, 4, 3};
  const int batch = 4;
  Mlp model(backend.get(), layers, batch);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.5f);
  std::vector<std::vector<float>> w;
  for (size_t n : model.TensorSizes()) {
    w.emplace_back(n);
    for (float& v : w.back()) v = normal(rng);
  }
  std::vector<float> x(batch * layers[0]);
  for (float& v : x) v = normal(rng);
  const std::vector<int> y = {0, 2, 1, 2};

  model.SetWeights(w);
  std::vector<int> seen;
  model.TrainStep(x.data(), y.data(), batch, 1.0f, false,
                  [&](int layer) { seen.push_back(layer); });
  EXPECT_EQ(seen, (std::vector<int>{2, 1, 0}));  // Last layer first.
  const std::vector<std::vector<float>> analytic = model.grads();

  auto loss = [&]() {
    model.SetWeights(w);
    double sum = 0;
    int64_t correct = 0;
    model.Evaluate(x.data(), y.data(), batch, &sum, &correct);
    return sum / batch;
  };
  const float h = 1e-2f;
  int checked = 0;
  for (size_t t = 0; t < w.size(); ++t) {
    for (size_t i = 0; i < w[t].size(); ++i) {
      const float saved = w[t][i];
      w[t][i] = saved + h;
      const double up = loss();
      w[t][i] = saved - h;
      const double down = loss();
      w[t][i] = saved;
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(analytic[t][i], numeric, 2e-3 + 2e-2 * std::abs(numeric))
          << "tensor " << t << " element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 6 * 5 + 5 + 5 * 4 + 4 + 4 * 3 + 3);
}

TEST(Mlp, AccumulateAddsGradients) {
  std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  Mlp model(backend.get(), {3, 2}, 2);
  std::vector<std::vector<float>> w = {{0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f},
                                       {0.0f, 0.1f}};
  model.SetWeights(w);
  const std::vector<float> x = {1, 2, 3, -1, 0, 1};
  const std::vector<int> y = {0, 1};
  model.TrainStep(x.data(), y.data(), 2, 1.0f, false, nullptr);
  const auto once = model.grads();
  model.TrainStep(x.data(), y.data(), 2, 1.0f, true, nullptr);
  for (size_t t = 0; t < once.size(); ++t) {
    for (size_t i = 0; i < once[t].size(); ++i) {
      EXPECT_FLOAT_EQ(model.grads()[t][i], 2 * once[t][i]);
    }
  }
}

TEST(Mlp, ParseLayersRejectsBadText) {
  EXPECT_TRUE(ParseLayers("784,256,10").ok());
  EXPECT_FALSE(ParseLayers("784").ok());
  EXPECT_FALSE(ParseLayers("784,,10").ok());
  EXPECT_FALSE(ParseLayers("784,-3,10").ok());
  EXPECT_FALSE(ParseLayers("784,x,10").ok());
}

}  // namespace
}  // namespace asyncps
