#include "worker/model/mlp.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace asyncps {

absl::StatusOr<std::vector<int>> ParseLayers(absl::string_view text) {
  std::vector<int> layers;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1 || n > (1 << 20)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--layers: '", part, "' is not a layer size in [1, 1048576]"));
    }
    layers.push_back(n);
  }
  if (layers.size() < 2) {
    return absl::InvalidArgumentError(
        "--layers needs at least an input and an output size, e.g. 784,10");
  }
  return layers;
}

v1::ModelSpec MlpSpec(const std::vector<int>& layers,
                      const v1::OptimizerSpec& optimizer, uint64_t seed,
                      uint64_t slice_bytes, int num_shards) {
  v1::ModelSpec spec;
  spec.set_name(absl::StrCat("mlp-", absl::StrJoin(layers, "-")));
  spec.set_seed(seed);
  spec.set_slice_bytes(slice_bytes);
  spec.set_num_shards(num_shards);
  *spec.mutable_optimizer() = optimizer;
  for (size_t l = 0; l + 1 < layers.size(); ++l) {
    v1::TensorSpec* w = spec.add_tensors();
    w->set_name(absl::StrCat("layer", l, "/w"));
    w->add_shape(layers[l]);
    w->add_shape(layers[l + 1]);
    w->set_dtype(v1::DTYPE_F32);
    w->mutable_init()->set_kind(v1::Initializer::HE_NORMAL);
    w->mutable_init()->set_fan_in(layers[l]);
    v1::TensorSpec* b = spec.add_tensors();
    b->set_name(absl::StrCat("layer", l, "/b"));
    b->add_shape(layers[l + 1]);
    b->set_dtype(v1::DTYPE_F32);
    b->mutable_init()->set_kind(v1::Initializer::ZEROS);
  }
  return spec;
}

absl::Status CheckLayersFit(const std::vector<int>& layers, int64_t features) {
  if (layers.empty() || layers.front() != features || layers.back() != 10) {
    return absl::InvalidArgumentError(
        absl::StrCat("--layers must start with ", features,
                     " (pixels per image) and end with 10 (classes)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> LayersFromSpec(const v1::ModelSpec& spec) {
  std::vector<int> layers;
  if (spec.tensors_size() < 2 || spec.tensors_size() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("model '", spec.name(), "' is not an MLP"));
  }
  for (int l = 0; l < spec.tensors_size() / 2; ++l) {
    const v1::TensorSpec& w = spec.tensors(2 * l);
    const v1::TensorSpec& b = spec.tensors(2 * l + 1);
    if (w.shape_size() != 2 || b.shape_size() != 1 ||
        b.shape(0) != w.shape(1) || (l > 0 && w.shape(0) != layers.back()) ||
        w.name() != absl::StrCat("layer", l, "/w")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model '", spec.name(), "' is not an MLP (layer ", l, ")"));
    }
    if (l == 0) layers.push_back(static_cast<int>(w.shape(0)));
    layers.push_back(static_cast<int>(w.shape(1)));
  }
  return layers;
}

Mlp::Mlp(Backend* backend, std::vector<int> layers, int max_batch)
    : backend_(backend), layers_(std::move(layers)) {
  const int L = num_layers();
  int widest = 0;
  for (int n : layers_) widest = std::max(widest, n);
  for (size_t size : TensorSizes()) {
    params_.emplace_back(backend_, size);
    dparams_.emplace_back(backend_, size);
    grads_.emplace_back(size, 0.0f);
    scratch_.emplace_back();
  }
  h_.emplace_back(backend_, static_cast<size_t>(max_batch) * layers_[0]);
  for (int l = 0; l < L; ++l) {
    z_.emplace_back(backend_, static_cast<size_t>(max_batch) * layers_[l + 1]);
    h_.emplace_back(backend_, static_cast<size_t>(max_batch) * layers_[l + 1]);
  }
  dz_ = DeviceArray<float>(backend_, static_cast<size_t>(max_batch) * widest);
  dh_ = DeviceArray<float>(backend_, static_cast<size_t>(max_batch) * widest);
  labels_ = DeviceArray<int32_t>(backend_, max_batch);
}

std::vector<size_t> Mlp::TensorSizes() const {
  std::vector<size_t> sizes;
  for (int l = 0; l < num_layers(); ++l) {
    sizes.push_back(static_cast<size_t>(layers_[l]) * layers_[l + 1]);
    sizes.push_back(layers_[l + 1]);
  }
  return sizes;
}

std::vector<std::vector<int>> Mlp::LayerTensors() const {
  std::vector<std::vector<int>> tensors;
  for (int l = 0; l < num_layers(); ++l) tensors.push_back({2 * l, 2 * l + 1});
  return tensors;
}

void Mlp::SetWeights(const std::vector<std::vector<float>>& weights) {
  for (int l = 0; l < num_layers(); ++l) SetLayerWeights(l, weights);
}

void Mlp::SetLayerWeights(int layer,
                          const std::vector<std::vector<float>>& weights) {
  params_[2 * layer].Upload(weights[2 * layer]);
  params_[2 * layer + 1].Upload(weights[2 * layer + 1]);
}

void Mlp::Forward(const float* x, const int* y, int batch) {
  h_[0].Upload(absl::MakeConstSpan(x, static_cast<size_t>(batch) * layers_[0]));
  std::vector<int32_t> labels(y, y + batch);
  labels_.Upload(labels);
  for (int l = 0; l < num_layers(); ++l) {
    const int in = layers_[l], out = layers_[l + 1];
    backend_->Gemm(false, false, batch, out, in, 1.0f, h_[l].data(),
                   params_[2 * l].data(), 0.0f, z_[l].data());
    backend_->AddBias(z_[l].data(), params_[2 * l + 1].data(), batch, out);
    if (l + 1 < num_layers()) {
      backend_->Relu(z_[l].data(), h_[l + 1].data(),
                     static_cast<size_t>(batch) * out);
    }
  }
}

double Mlp::TrainStep(const float* x, const int* y, int batch, float grad_scale,
                      bool accumulate, const LayerDone& done,
                      int64_t* correct) {
  Forward(x, y, batch);
  const int L = num_layers();
  double loss_sum = 0;
  int64_t right = 0;
  backend_->SoftmaxCrossEntropy(z_[L - 1].data(), labels_.data(), batch,
                                layers_[L], grad_scale / batch, dz_.data(),
                                &loss_sum, &right);
  if (correct != nullptr) *correct = right;
  // Layer l's gradients are copied to the host while the GPU goes on with
  // layer l-1; the host waits for layer l's copy only after queueing that
  // work, then hands the layer to `done` (which starts its push).
  int64_t tickets[2] = {0, 0};
  int pending = -1;
  auto finish = [&](int layer) {
    for (int k = 0; k < 2; ++k) {
      const int t = 2 * layer + k;
      backend_->WaitDownload(tickets[k]);
      if (accumulate) {
        std::vector<float>& host = grads_[t];
        for (size_t i = 0; i < host.size(); ++i) host[i] += scratch_[t][i];
      }
    }
    if (done) done(layer);
  };
  for (int l = L - 1; l >= 0; --l) {
    const int in = layers_[l], out = layers_[l + 1];
    // dW = h^T dz; db = column sums of dz.
    backend_->Gemm(true, false, in, out, batch, 1.0f, h_[l].data(), dz_.data(),
                   0.0f, dparams_[2 * l].data());
    backend_->ColumnSum(dz_.data(), batch, out, 0.0f,
                        dparams_[2 * l + 1].data());
    if (pending >= 0) finish(pending);
    for (int k = 0; k < 2; ++k) {
      const int t = 2 * l + k;
      std::vector<float>& host = accumulate ? scratch_[t] : grads_[t];
      host.resize(grads_[t].size());
      tickets[k] = backend_->DownloadAsync(dparams_[t].data(), host.data(),
                                           host.size() * sizeof(float));
    }
    pending = l;
    if (l > 0) {
      // dh = dz W^T, then through the ReLU of layer l-1.
      backend_->Gemm(false, true, batch, in, out, 1.0f, dz_.data(),
                     params_[2 * l].data(), 0.0f, dh_.data());
      backend_->ReluBackward(z_[l - 1].data(), dh_.data(), dz_.data(),
                             static_cast<size_t>(batch) * in);
    }
  }
  finish(pending);
  return loss_sum / batch;
}

void Mlp::Evaluate(const float* x, const int* y, int batch, double* loss_sum,
                   int64_t* correct) {
  Forward(x, y, batch);
  const int L = num_layers();
  backend_->SoftmaxCrossEntropy(z_[L - 1].data(), labels_.data(), batch,
                                layers_[L], 0.0f, nullptr, loss_sum, correct);
}

}  // namespace asyncps
