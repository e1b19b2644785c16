// Mlp: a multi-layer perceptron (ReLU hidden layers, softmax cross-entropy)
// computed on a Backend. Parameters are tensors "layerL/w" (in x out,
// row-major) and "layerL/b" (out), in that order: tensor 2L and 2L+1.
// Not thread-safe; one Mlp per worker thread.
#ifndef ASYNCPS_WORKER_MODEL_MLP_H_
#define ASYNCPS_WORKER_MODEL_MLP_H_

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/asyncps.pb.h"
#include "worker/backend.h"

namespace asyncps {

// Parses "784,256,128,10": at least two sizes, each in [1, 1<<20].
absl::StatusOr<std::vector<int>> ParseLayers(absl::string_view text);

// The model spec for an MLP with these layer sizes: He-normal weights, zero
// biases, the given optimizer.
v1::ModelSpec MlpSpec(const std::vector<int>& layers,
                      const v1::OptimizerSpec& optimizer, uint64_t seed,
                      uint64_t slice_bytes, int num_shards);

// The layer sizes of an MLP spec made by MlpSpec, or INVALID_ARGUMENT if the
// spec is not such an MLP.
absl::StatusOr<std::vector<int>> LayersFromSpec(const v1::ModelSpec& spec);

// OK if `layers` start with `features` (pixels per example) and end with 10
// (classes); else INVALID_ARGUMENT naming --layers.
absl::Status CheckLayersFit(const std::vector<int>& layers, int64_t features);

class Mlp {
 public:
  // Called during Backward once layer L's gradients are on the host in
  // grads()[2L] and grads()[2L+1]; layers arrive from last to first.
  using LayerDone = std::function<void(int layer)>;

  // `backend` is borrowed. `max_batch` bounds the batch size of every call.
  Mlp(Backend* backend, std::vector<int> layers, int max_batch);

  int num_layers() const { return static_cast<int>(layers_.size()) - 1; }
  int num_tensors() const { return 2 * num_layers(); }
  const std::vector<int>& layers() const { return layers_; }
  // Element count of each tensor.
  std::vector<size_t> TensorSizes() const;
  // The tensors of each layer ({2L, 2L+1}), as the exchanges take them.
  std::vector<std::vector<int>> LayerTensors() const;

  // Copies host weights (one vector per tensor) to the backend.
  void SetWeights(const std::vector<std::vector<float>>& weights);
  // Copies only tensors of `layer`.
  void SetLayerWeights(int layer,
                       const std::vector<std::vector<float>>& weights);

  // Forward and backward on `batch` examples (x: batch x layers[0]).
  // Gradients are of the mean loss over the batch, times `grad_scale`; with
  // `accumulate` they are added to the host gradients from earlier calls
  // instead of replacing them. Returns the mean loss; `correct` (if not
  // null) gets the number classified right.
  double TrainStep(const float* x, const int* y, int batch, float grad_scale,
                   bool accumulate, const LayerDone& done,
                   int64_t* correct = nullptr);

  // Forward only: summed loss and number right.
  void Evaluate(const float* x, const int* y, int batch, double* loss_sum,
                int64_t* correct);

  // Host gradients, one vector per tensor.
  std::vector<std::vector<float>>& grads() { return grads_; }

 private:
  void Forward(const float* x, const int* y, int batch);

  Backend* const backend_;
  const std::vector<int> layers_;
  std::vector<DeviceArray<float>> params_;  // Per tensor.
  std::vector<DeviceArray<float>> dparams_;
  std::vector<DeviceArray<float>> z_;  // Pre-activations, per layer.
  std::vector<DeviceArray<float>> h_;  // h_[0] = input, h_[L+1] = relu(z_[L]).
  DeviceArray<float> dz_, dh_;
  DeviceArray<int32_t> labels_;
  std::vector<std::vector<float>> grads_;
  std::vector<std::vector<float>> scratch_;  // Per tensor, for accumulate.
};

}  // namespace asyncps

#endif  // ASYNCPS_WORKER_MODEL_MLP_H_
