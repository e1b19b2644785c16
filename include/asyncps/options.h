// What a model's optimizer and an embedding table are declared with
// (Client::Declare, Client::DeclareEmbedding in asyncps/client.h).
#ifndef ASYNCPS_INCLUDE_ASYNCPS_OPTIONS_H_
#define ASYNCPS_INCLUDE_ASYNCPS_OPTIONS_H_

#include <cstdint>
#include <string>

namespace asyncps {

// How the servers turn gradients into weights (common/optimizer.h).
struct OptimizerOptions {
  // sgd, momentum, adam, adamw, adagrad; the outer optimizers (docs/MODES.md
  // "Outer optimizers"): delayed_nesterov (async DiLoCo), elastic (EASGD's
  // centre, learning_rate its moving rate).
  std::string kind = "sgd";
  float learning_rate = 0.01f;
  float momentum = 0.9f;  // momentum.
  bool nesterov = false;  // momentum.
  // momentum, as PyTorch's SGD: after the first update,
  // v = momentum * v + (1 - dampening) * g.
  float dampening = 0.0f;
  float beta1 = 0.9f;     // adam, adamw.
  float beta2 = 0.999f;   // adam, adamw.
  float epsilon = 1e-8f;  // adam, adamw, adagrad.
  // L2 (added to the gradient); adamw: decoupled (w *= 1 - lr * decay).
  float weight_decay = 0.0f;
  // Inverse-time decay: a slice's t-th update uses
  // learning_rate / (1 + lr_decay * t).
  float lr_decay = 0.0f;
  float initial_accumulator_value = 0.0f;  // adagrad.
  int delay = 1;  // delayed_nesterov: pushes per momentum update.
};

// A sparse embedding table (docs/SPARSE.md): rows of `dim` floats by a
// 64-bit id, spread over the shards by the id, pulled and pushed a batch's
// rows at a time.
struct EmbeddingOptions {
  int64_t dim = 0;
  // Ids in [0, num_rows); 0: unbounded (any 64-bit id, e.g. hashed
  // features).
  int64_t num_rows = 0;
  OptimizerOptions optimizer;  // Applied row by row; adam is "lazy".
  // Each row's first values: N(0, init_stddev^2) (0: zeros).
  float init_stddev = 0.01f;
  // The most rows a shard keeps; a new row past it takes the place of the
  // least recently used one (0: no limit).
  int64_t max_rows_per_shard = 0;
  uint64_t seed = 0;
  // Admission: an id gets a row at its admit_count-th push (1: the first;
  // earlier pushes are dropped). Expiry: a row not pushed for ttl_pushes of
  // its table's pushes on its shard, or for ttl_seconds, is removed (0:
  // never; at most one). docs/SPARSE.md.
  int admit_count = 1;
  int64_t ttl_pushes = 0;
  double ttl_seconds = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_INCLUDE_ASYNCPS_OPTIONS_H_
