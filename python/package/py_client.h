// PyClient: asyncps::Client as the Python module's Client class
// (python/package/core.cc binds it), and the conversions between numpy
// arrays, Python objects and the client's types. Arrays cross without a
// copy: a pull decodes straight into numpy memory and a push encodes
// straight from it, so arrays must be float32 and C-contiguous
// (ValueError otherwise, naming the tensor). The GIL is released while a
// call waits on the network. A failed call raises the exception its status
// maps to, with the server's message.
#ifndef ASYNCPS_PYTHON_PACKAGE_PY_CLIENT_H_
#define ASYNCPS_PYTHON_PACKAGE_PY_CLIENT_H_

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "asyncps/client.h"

namespace asyncps {

namespace py = pybind11;

// Raises the Python exception for `s` (nothing if OK): ValueError for bad
// input, KeyError for an unknown name, ConnectionError for a server gone,
// PermissionError for a refused identity, RuntimeError otherwise.
void Raise(const absl::Status& s);
// `a` as the float32 C-contiguous array tensor `name` needs (writable if
// `write`), or ValueError naming the tensor.
py::array Checked(const std::string& name, py::handle a, bool write);
// The array's elements (REQUIRES: Checked).
absl::Span<const float> ConstView(const py::array& a);
absl::Span<float> View(py::array& a);

class PyClient {
 public:
  PyClient(py::object servers, int rank, int num_workers,
           const std::string& mode, const std::string& wire_dtype,
           const std::string& transport, double rpc_timeout, double retry_for,
           double heartbeat, int64_t slice_bytes, const std::string& tls_cert,
           const std::string& tls_key, const std::string& tls_ca,
           const std::string& auth_token_file, bool reader,
           const std::string& compress);

  void Declare(py::dict arrays, const std::string& optimizer, float lr,
               float momentum, bool nesterov, float beta1, float beta2,
               float eps, float weight_decay, float dampening, float lr_decay,
               float initial_accumulator_value, int delay, py::object buffers,
               py::object wire_dtypes);

  void Attach();

  // Fresh arrays, shaped as declared, with the weights of `names` (all
  // tensors if None).
  py::dict Pull(py::object names);

  // Pulls into the given arrays (float32, C-contiguous, writable).
  void PullIntoArrays(py::dict arrays);

  // What the servers did, summed over the slices the push reached.
  py::dict Push(py::dict grads, py::object hyper);

  py::dict PushPull(py::dict grads);

  // Pushes `grads` and pulls the same tensors' new weights into `out`
  // (arrays by the same names, written in place), in one round trip per
  // shard. `hyper`, if given, maps every name to the hyper-parameters its
  // gradient is applied with (keys as declare's: lr, momentum, dampening,
  // nesterov, beta1, beta2, eps, weight_decay, lr_decay,
  // initial_accumulator_value; missing ones take declare's defaults).
  void PushPullInto(py::dict grads, py::dict out, py::object hyper);

  // bsp: no gradient from this rank for `names` this step.
  void PushNoGradient(const std::vector<std::string>& names);
  void EndStep() {
    py::gil_scoped_release release;  // bsp: it may push (no gradients).
    client_->EndStep();
  }

  // Sparse embedding tables (asyncps.Client.declare_embedding, pull_rows,
  // push_rows): ids are int64 arrays (or anything numpy makes one of),
  // rows and gradients float32 (len(ids), dim).
  void DeclareEmbedding(const std::string& name, int64_t dim,
                        py::object num_rows, const std::string& optimizer,
                        float lr, float eps, float beta1, float beta2,
                        float weight_decay, float initial_accumulator_value,
                        float init_stddev, int64_t max_rows_per_shard,
                        uint64_t seed, int admit_count, py::object ttl);
  py::array PullRows(const std::string& name, py::object ids);
  void PushRows(const std::string& name, py::object ids, py::object grads);
  py::array PushPullRows(const std::string& name, py::object ids,
                         py::object grads, py::object pull_ids);

  // {name: {"slot1": array or None, "slot2": ..., "steps": int}}.
  py::dict PullState(py::object names);

  void LoadState(py::dict state);

  void Report(int64_t samples, double samples_per_second, double loss,
              double data_seconds, double compute_seconds,
              double exchange_seconds, double steps_per_second);
  double FastestStepsPerSecond() const {
    return client_->FastestStepsPerSecond();
  }
  std::string mode() const { return client_->mode(); }
  int rank() const { return client_->rank(); }
  int num_workers() const { return client_->num_workers(); }
  // Client::members() as a dict: live_ranks, elastic, index, size.
  py::dict Members() const {
    const asyncps::Members m = client_->members();
    py::dict d;
    d["live_ranks"] = py::cast(m.live_ranks);
    d["elastic"] = m.elastic;
    d["index"] = m.index;
    d["size"] = m.size;
    return d;
  }
  int64_t clock() const { return client_->clock(); }

  py::dict Tensors() const;

  py::dict WireDtypes() const;

  py::dict Traffic() const;

  void Leave() {
    py::gil_scoped_release release;
    client_->Leave();
  }

  // After a call raised because a shard restarted without a checkpoint
  // and lost the model: declares it there again, hands it `arrays` (every
  // tensor, this worker's copy) and pulls every tensor afresh into them.
  // False if no shard had lost it (the error was something else).
  bool Recover(py::dict arrays);

 private:
  // A new float32 array of n rows of table `name`'s width (KeyError-like
  // NOT_FOUND if this client has not declared it).
  py::array_t<float> RowsFor(const std::string& name, py::ssize_t n) const;
  // Row widths of the embedding tables this client declared.
  absl::flat_hash_map<std::string, int64_t> dims_;
  // `hyper` ({name: {...}}) for each of `names`, or ValueError.
  std::vector<OptimizerOptions> HyperFor(const std::vector<std::string>& names,
                                         py::object hyper) const;

  // One tensor's hyper-parameters from a dict (unknown keys are refused).
  OptimizerOptions Hyper(const std::string& name, py::handle value) const;

  std::vector<std::string> Names(py::object names) const;

  using ShapeMap = absl::flat_hash_map<std::string, std::vector<py::ssize_t>>;
  // The declared shapes by name, read once per call.
  ShapeMap Shapes() const;

  // An unknown name gets an empty array, and the call then raises the
  // client's KeyError (which names the model's tensors).
  static std::vector<py::ssize_t> Shape(const ShapeMap& shapes,
                                        const std::string& name) {
    auto it = shapes.find(name);
    return it != shapes.end() ? it->second : std::vector<py::ssize_t>{0};
  }

  void PullInto(const std::vector<std::string>& names,
                std::vector<py::array>* arrays);

  static void Gradients(py::dict grads, std::vector<std::string>* names,
                        std::vector<py::array>* keep,
                        std::vector<absl::Span<const float>>* views);

  // `names` resolved once (Client::Resolve) and kept, so a training
  // loop's calls look no name up; KeyError for an unknown name. Called with
  // the GIL held, which serialises the cache; emptied when a model is
  // declared or attached.
  std::shared_ptr<const TensorSet> Resolved(
      const std::vector<std::string>& names);

  std::unique_ptr<Client> client_;
  std::string kind_;  // The optimizer this client declared ("" if attached).
  // Resolved sets by their names joined with '\n' (which no name holds);
  // at most kMaxResolved (a loop whose tensors vary each step starts over).
  static constexpr size_t kMaxResolved = 256;
  absl::flat_hash_map<std::string, std::shared_ptr<const TensorSet>> resolved_;
};

}  // namespace asyncps

#endif  // ASYNCPS_PYTHON_PACKAGE_PY_CLIENT_H_
