// asyncps._core: the client library (include/asyncps/client.h) for Python,
// with pybind11. Arrays cross without a copy: a pull decodes straight into
// numpy memory and a push encodes straight from it, so arrays must be
// float32 and C-contiguous (ValueError otherwise, naming the tensor). The
// GIL is released while a call waits on the network. A failed call raises
// the exception its status maps to, with the server's message.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "asyncps/client.h"

namespace py = pybind11;

namespace asyncps {
namespace {

// Raises the Python exception for `s` (nothing if OK): ValueError for bad
// input, KeyError for an unknown name, ConnectionError for a server gone,
// PermissionError for a refused identity, RuntimeError otherwise.
void Raise(const absl::Status& s) {
  if (s.ok()) return;
  const std::string text = s.ToString();
  switch (s.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      throw py::value_error(text);
    case absl::StatusCode::kNotFound:
      throw py::key_error(text);
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kDeadlineExceeded:
      PyErr_SetString(PyExc_ConnectionError, text.c_str());
      throw py::error_already_set();
    case absl::StatusCode::kPermissionDenied:
    case absl::StatusCode::kUnauthenticated:
      PyErr_SetString(PyExc_PermissionError, text.c_str());
      throw py::error_already_set();
    default:
      throw std::runtime_error(text);
  }
}

// `a` as a float32 C-contiguous array (writable if `write`), or ValueError
// naming `name`; never a copy.
py::array Checked(const std::string& name, py::handle a, bool write) {
  if (!py::isinstance<py::array>(a)) {
    throw py::value_error(absl::StrCat("tensor '", name,
                                       "': want a numpy array, got ",
                                       std::string(py::str(a.get_type()))));
  }
  py::array array = py::reinterpret_borrow<py::array>(a);
  if (!array.dtype().is(py::dtype::of<float>())) {
    throw py::value_error(absl::StrCat("tensor '", name, "': dtype ",
                                       std::string(py::str(array.dtype())),
                                       ", want float32"));
  }
  if (!(array.flags() & py::array::c_style)) {
    throw py::value_error(
        absl::StrCat("tensor '", name,
                     "': not C-contiguous (np.ascontiguousarray makes it so)"));
  }
  if (write && !array.writeable()) {
    throw py::value_error(absl::StrCat("tensor '", name, "': read-only"));
  }
  return array;
}

absl::Span<const float> ConstView(const py::array& a) {
  return {static_cast<const float*>(a.data()), static_cast<size_t>(a.size())};
}

absl::Span<float> View(py::array& a) {
  return {static_cast<float*>(a.mutable_data()), static_cast<size_t>(a.size())};
}

class PyClient {
 public:
  PyClient(py::object servers, int rank, int num_workers,
           const std::string& mode, const std::string& wire_dtype,
           const std::string& transport, double rpc_timeout, double retry_for,
           double heartbeat, int64_t slice_bytes, const std::string& tls_cert,
           const std::string& tls_key, const std::string& tls_ca,
           const std::string& auth_token_file, bool reader) {
    ClientOptions o;
    o.worker = !reader;
    if (py::isinstance<py::str>(servers)) {
      std::string list = servers.cast<std::string>();
      size_t start = 0;
      while (start <= list.size()) {
        size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        o.servers.push_back(list.substr(start, comma - start));
        start = comma + 1;
      }
    } else {
      o.servers = servers.cast<std::vector<std::string>>();
    }
    o.rank = rank;
    o.num_workers = num_workers;
    o.mode = mode;
    o.wire_dtype = wire_dtype;
    o.transport = transport;
    o.rpc_timeout_seconds = rpc_timeout;
    o.retry_for_seconds = retry_for;
    o.heartbeat_seconds = heartbeat;
    o.slice_bytes = slice_bytes;
    o.tls_cert = tls_cert;
    o.tls_key = tls_key;
    o.tls_ca = tls_ca;
    o.auth_token_file = auth_token_file;
    absl::StatusOr<std::unique_ptr<Client>> c;
    {
      py::gil_scoped_release release;
      c = Client::Connect(o);
    }
    Raise(c.status());
    client_ = *std::move(c);
  }

  void Declare(py::dict arrays, const std::string& optimizer, float lr,
               float momentum, bool nesterov, float beta1, float beta2,
               float eps, float weight_decay, float dampening, float lr_decay,
               float initial_accumulator_value, py::object buffers,
               py::object wire_dtypes) {
    absl::flat_hash_set<std::string> is_buffer;
    if (!buffers.is_none()) {
      for (auto name : buffers) is_buffer.insert(py::str(name));
    }
    absl::flat_hash_map<std::string, std::string> wire;
    if (!wire_dtypes.is_none()) {
      for (auto [name, dtype] : py::dict(wire_dtypes)) {
        wire[std::string(py::str(name))] = std::string(py::str(dtype));
      }
    }
    std::vector<TensorSpec> tensors;
    std::vector<py::array> keep;  // Alive (and referenced) across the call.
    std::vector<absl::Span<const float>> initial;
    for (auto [key, value] : arrays) {
      const std::string name = py::str(key);
      keep.push_back(Checked(name, value, /*write=*/false));
      TensorSpec t{name, {}, is_buffer.contains(name)};
      if (auto w = wire.find(name); w != wire.end()) {
        t.wire_dtype = w->second;
        wire.erase(w);
      }
      for (py::ssize_t d = 0; d < keep.back().ndim(); ++d) {
        t.shape.push_back(keep.back().shape(d));
      }
      if (t.shape.empty()) t.shape.push_back(1);  // A scalar: one element.
      tensors.push_back(std::move(t));
      initial.push_back(ConstView(keep.back()));
    }
    if (!wire.empty()) {
      throw py::key_error("wire_dtypes names '" + wire.begin()->first +
                          "', which is not among the arrays");
    }
    OptimizerOptions opt;
    opt.kind = optimizer;
    opt.learning_rate = lr;
    opt.momentum = momentum;
    opt.nesterov = nesterov;
    opt.beta1 = beta1;
    opt.beta2 = beta2;
    opt.epsilon = eps;
    opt.weight_decay = weight_decay;
    opt.dampening = dampening;
    opt.lr_decay = lr_decay;
    opt.initial_accumulator_value = initial_accumulator_value;
    kind_ = optimizer;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Declare(tensors, initial, opt);
    }
    Raise(s);
  }

  void Attach() {
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Attach();
    }
    Raise(s);
  }

  // Fresh arrays, shaped as declared, with the weights of `names` (all
  // tensors if None).
  py::dict Pull(py::object names) {
    std::vector<std::string> which = Names(names);
    const ShapeMap shapes = Shapes();
    py::dict out;
    std::vector<py::array> keep;
    for (const std::string& name : which) {
      keep.push_back(py::array_t<float>(Shape(shapes, name)));
      out[py::str(name)] = keep.back();
    }
    PullInto(which, &keep);
    return out;
  }

  // Pulls into the given arrays (float32, C-contiguous, writable).
  void PullIntoArrays(py::dict arrays) {
    std::vector<std::string> names;
    std::vector<py::array> keep;
    for (auto [key, value] : arrays) {
      names.push_back(py::str(key));
      keep.push_back(Checked(names.back(), value, /*write=*/true));
    }
    PullInto(names, &keep);
  }

  // What the servers did, summed over the slices the push reached.
  py::dict Push(py::dict grads, py::object hyper) {
    std::vector<std::string> names;
    std::vector<py::array> keep;
    std::vector<absl::Span<const float>> views;
    Gradients(grads, &names, &keep, &views);
    PushStats stats;
    CallOptions options;
    options.stats = &stats;
    std::vector<OptimizerOptions> optimizers;
    if (!hyper.is_none()) {
      optimizers = HyperFor(names, hyper);
      options.optimizers = &optimizers;
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Push(names, views, options);
    }
    Raise(s);
    py::dict out;
    out["slices"] = stats.slices;
    out["staleness"] = stats.total_staleness;
    out["max_staleness"] = stats.max_staleness;
    out["dropped"] = stats.dropped;
    return out;
  }

  py::dict PushPull(py::dict grads) {
    std::vector<std::string> names;
    std::vector<py::array> keep;
    std::vector<absl::Span<const float>> views;
    Gradients(grads, &names, &keep, &views);
    py::dict out;
    std::vector<py::array> fresh;
    std::vector<absl::Span<float>> out_views;
    const ShapeMap shapes = Shapes();
    for (const std::string& name : names) {
      fresh.push_back(py::array_t<float>(Shape(shapes, name)));
      out[py::str(name)] = fresh.back();
      out_views.push_back(View(fresh.back()));
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->PushPull(names, views, out_views);
    }
    Raise(s);
    return out;
  }

  // Pushes `grads` and pulls the same tensors' new weights into `out`
  // (arrays by the same names, written in place), in one round trip per
  // shard. `hyper`, if given, maps every name to the hyper-parameters its
  // gradient is applied with (keys as declare's: lr, momentum, dampening,
  // nesterov, beta1, beta2, eps, weight_decay, lr_decay,
  // initial_accumulator_value; missing ones take declare's defaults).
  void PushPullInto(py::dict grads, py::dict out, py::object hyper) {
    std::vector<std::string> names;
    std::vector<py::array> keep;
    std::vector<absl::Span<const float>> views;
    Gradients(grads, &names, &keep, &views);
    std::vector<py::array> into;
    std::vector<absl::Span<float>> out_views;
    for (const std::string& name : names) {
      if (!out.contains(name)) {
        throw py::value_error(
            absl::StrCat("push_pull_into: no output array for '", name, "'"));
      }
      into.push_back(Checked(name, out[py::str(name)], /*write=*/true));
      out_views.push_back(View(into.back()));
    }
    std::vector<OptimizerOptions> optimizers;
    CallOptions options;
    if (!hyper.is_none()) {
      optimizers = HyperFor(names, hyper);
      options.optimizers = &optimizers;
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->PushPull(names, views, out_views, options);
    }
    Raise(s);
  }

  void EndStep() { client_->EndStep(); }

  // {name: {"slot1": array or None, "slot2": ..., "steps": int}}.
  py::dict PullState(py::object names) {
    const std::vector<std::string> which = Names(names);
    std::vector<OptimizerState> state;
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->PullOptimizerState(which, &state);
    }
    Raise(s);
    const ShapeMap shapes = Shapes();
    py::dict out;
    for (size_t k = 0; k < which.size(); ++k) {
      py::dict one;
      auto slot = [&](const std::vector<float>& v) -> py::object {
        if (v.empty()) return py::none();
        py::array_t<float> a(Shape(shapes, which[k]));
        std::copy(v.begin(), v.end(), a.mutable_data());
        return std::move(a);
      };
      one["slot1"] = slot(state[k].slot1);
      one["slot2"] = slot(state[k].slot2);
      one["steps"] = state[k].steps;
      out[py::str(which[k])] = one;
    }
    return out;
  }

  void LoadState(py::dict state) {
    std::vector<std::string> names;
    std::vector<OptimizerState> slots;
    for (auto [key, value] : state) {
      names.push_back(py::str(key));
      py::dict one = value.cast<py::dict>();
      OptimizerState o;
      for (const char* which : {"slot1", "slot2"}) {
        if (!one.contains(which) || one[which].is_none()) continue;
        py::array a = Checked(names.back(), one[which], /*write=*/false);
        auto v = ConstView(a);
        (std::string(which) == "slot1" ? o.slot1 : o.slot2)
            .assign(v.begin(), v.end());
      }
      if (one.contains("steps")) o.steps = one["steps"].cast<int64_t>();
      slots.push_back(std::move(o));
    }
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->LoadOptimizerState(names, slots);
    }
    Raise(s);
  }

  void Report(int64_t samples, double samples_per_second, double loss,
              double data_seconds, double compute_seconds,
              double exchange_seconds) {
    Progress p;
    p.samples = samples;
    p.samples_per_second = samples_per_second;
    p.loss = loss;
    p.data_seconds = data_seconds;
    p.compute_seconds = compute_seconds;
    p.exchange_seconds = exchange_seconds;
    client_->ReportProgress(p);
  }
  std::string mode() const { return client_->mode(); }
  int rank() const { return client_->rank(); }
  int num_workers() const { return client_->num_workers(); }
  int64_t clock() const { return client_->clock(); }

  py::dict Tensors() const {
    py::dict out;
    for (const TensorSpec& t : client_->tensors()) {
      out[py::str(t.name)] = py::tuple(py::cast(t.shape));
    }
    return out;
  }

  py::dict WireDtypes() const {
    py::dict out;
    for (const TensorSpec& t : client_->tensors()) {
      out[py::str(t.name)] = py::str(t.wire_dtype);
    }
    return out;
  }

  py::dict Traffic() const {
    const TrafficStats t = client_->traffic();
    py::dict out;
    out["sent_bytes"] = t.sent_bytes;
    out["received_bytes"] = t.received_bytes;
    out["retries"] = t.retries;
    return out;
  }

  void Leave() {
    py::gil_scoped_release release;
    client_->Leave();
  }

  // After a call raised because a shard restarted without a checkpoint
  // and lost the model: declares it there again, hands it `arrays` (every
  // tensor, this worker's copy) and pulls every tensor afresh into them.
  // False if no shard had lost it (the error was something else).
  bool Recover(py::dict arrays) {
    const std::vector<TensorSpec> tensors = client_->tensors();
    std::vector<py::array> keep;
    for (const TensorSpec& t : tensors) {
      if (!arrays.contains(t.name)) {
        throw py::value_error(absl::StrCat("recover needs every tensor; '",
                                           t.name, "' is missing"));
      }
      keep.push_back(Checked(t.name, arrays[py::str(t.name)], /*write=*/true));
    }
    std::vector<absl::Span<float>> views;
    for (py::array& a : keep) views.push_back(View(a));
    const absl::Status asked =
        absl::FailedPreconditionError("recover: no shard lost the model");
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Recover(asked, views);
    }
    if (s == asked) return false;
    Raise(s);
    return true;
  }

 private:
  // `hyper` ({name: {...}}) for each of `names`, or ValueError.
  std::vector<OptimizerOptions> HyperFor(const std::vector<std::string>& names,
                                         py::object hyper) const {
    py::dict by_name = hyper.cast<py::dict>();
    std::vector<OptimizerOptions> out;
    for (const std::string& name : names) {
      if (!by_name.contains(name)) {
        throw py::value_error(
            absl::StrCat("no hyper-parameters for '", name, "'"));
      }
      out.push_back(Hyper(name, by_name[py::str(name)]));
    }
    return out;
  }

  // One tensor's hyper-parameters from a dict (unknown keys are refused).
  OptimizerOptions Hyper(const std::string& name, py::handle value) const {
    if (kind_.empty()) {
      throw py::value_error(
          "hyper-parameters per push need the optimizer this client "
          "declared; call declare (not attach) first");
    }
    OptimizerOptions o;
    o.kind = kind_;
    for (auto [k, v] : value.cast<py::dict>()) {
      const std::string key = py::str(k);
      if (key == "lr") {
        o.learning_rate = v.cast<float>();
      } else if (key == "momentum") {
        o.momentum = v.cast<float>();
      } else if (key == "dampening") {
        o.dampening = v.cast<float>();
      } else if (key == "nesterov") {
        o.nesterov = v.cast<bool>();
      } else if (key == "beta1") {
        o.beta1 = v.cast<float>();
      } else if (key == "beta2") {
        o.beta2 = v.cast<float>();
      } else if (key == "eps") {
        o.epsilon = v.cast<float>();
      } else if (key == "weight_decay") {
        o.weight_decay = v.cast<float>();
      } else if (key == "lr_decay") {
        o.lr_decay = v.cast<float>();
      } else if (key == "initial_accumulator_value") {
        o.initial_accumulator_value = v.cast<float>();
      } else {
        throw py::value_error(absl::StrCat(
            "tensor '", name, "': unknown hyper-parameter '", key, "'"));
      }
    }
    return o;
  }

  std::vector<std::string> Names(py::object names) const {
    std::vector<std::string> out;
    if (names.is_none()) {
      for (const TensorSpec& t : client_->tensors()) out.push_back(t.name);
    } else if (py::isinstance<py::str>(names)) {
      out.push_back(names.cast<std::string>());
    } else {
      out = names.cast<std::vector<std::string>>();
    }
    return out;
  }

  using ShapeMap = absl::flat_hash_map<std::string, std::vector<py::ssize_t>>;
  // The declared shapes by name, read once per call.
  ShapeMap Shapes() const {
    ShapeMap shapes;
    for (const TensorSpec& t : client_->tensors()) {
      shapes[t.name] = {t.shape.begin(), t.shape.end()};
    }
    return shapes;
  }

  // An unknown name gets an empty array, and the call then raises the
  // client's KeyError (which names the model's tensors).
  static std::vector<py::ssize_t> Shape(const ShapeMap& shapes,
                                        const std::string& name) {
    auto it = shapes.find(name);
    return it != shapes.end() ? it->second : std::vector<py::ssize_t>{0};
  }

  void PullInto(const std::vector<std::string>& names,
                std::vector<py::array>* arrays) {
    std::vector<absl::Span<float>> views;
    for (py::array& a : *arrays) views.push_back(View(a));
    absl::Status s;
    {
      py::gil_scoped_release release;
      s = client_->Pull(names, views);
    }
    Raise(s);
  }

  static void Gradients(py::dict grads, std::vector<std::string>* names,
                        std::vector<py::array>* keep,
                        std::vector<absl::Span<const float>>* views) {
    for (auto [key, value] : grads) {
      names->push_back(py::str(key));
      keep->push_back(Checked(names->back(), value, /*write=*/false));
    }
    for (const py::array& a : *keep) views->push_back(ConstView(a));
  }

  std::unique_ptr<Client> client_;
  std::string kind_;  // The optimizer this client declared ("" if attached).
};

}  // namespace
}  // namespace asyncps

PYBIND11_MODULE(_core, m) {
  using asyncps::PyClient;
  m.doc() = "asyncps's client library (see asyncps.Client).";
  py::class_<PyClient>(m, "Client", R"(One worker of an asyncps job.

Connects to every shard and joins the job (a rank, heartbeats, the
servers' mode); arrays are float32 and C-contiguous, and cross without a
copy. reader=True joins no job: it may attach and pull (an evaluator).)")
      .def(py::init<py::object, int, int, const std::string&,
                    const std::string&, const std::string&, double, double,
                    double, int64_t, const std::string&, const std::string&,
                    const std::string&, const std::string&, bool>(),
           py::arg("servers"), py::arg("rank") = -1, py::arg("num_workers") = 1,
           py::arg("mode") = "async", py::arg("wire_dtype") = "f32",
           py::arg("transport") = "tcp", py::arg("rpc_timeout") = 30.0,
           py::arg("retry_for") = 60.0, py::arg("heartbeat") = 1.0,
           py::arg("slice_bytes") = 256 << 10, py::arg("tls_cert") = "",
           py::arg("tls_key") = "", py::arg("tls_ca") = "",
           py::arg("auth_token_file") = "", py::arg("reader") = false)
      .def("declare", &PyClient::Declare, py::arg("arrays"),
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01f,
           py::arg("momentum") = 0.9f, py::arg("nesterov") = false,
           py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f,
           py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.0f,
           py::arg("dampening") = 0.0f, py::arg("lr_decay") = 0.0f,
           py::arg("initial_accumulator_value") = 0.0f,
           py::arg("buffers") = py::none(), py::arg("wire_dtypes") = py::none(),
           "Declares the model {name: initial array}; the first worker's "
           "arrays are the initial weights. `buffers`: names of model "
           "buffers (averaged, not trained); `wire_dtypes`: {name: 'f32', "
           "'bf16' or 'f16'}, the dtype a tensor travels in (default: the "
           "client's wire_dtype).")
      .def("attach", &PyClient::Attach,
           "Adopts the model another worker declared (waits for it).")
      .def("pull", &PyClient::Pull, py::arg("names") = py::none(),
           "{name: weights} of `names` (all tensors if None), new arrays.")
      .def("pull_into", &PyClient::PullIntoArrays, py::arg("arrays"),
           "Pulls into the given {name: array} (written in place).")
      .def("push", &PyClient::Push, py::arg("grads"),
           py::arg("hyper") = py::none(),
           "Pushes {name: gradient} for the step in progress. Returns what "
           "the servers did: slices reached, staleness (updates each slice "
           "had taken since the weights the gradient came from were "
           "pulled, summed), max_staleness, dropped (slices that did not "
           "apply it: late in bsp, or a shard restarted since).")
      .def("push_pull", &PyClient::PushPull, py::arg("grads"),
           "Pushes {name: gradient}, returns the weights after the step; "
           "ends the step.")
      .def("push_pull_into", &PyClient::PushPullInto, py::arg("grads"),
           py::arg("out"), py::arg("hyper") = py::none(),
           "Pushes {name: gradient} and writes the new weights into "
           "{name: array} in place; hyper={name: {lr: ..., ...}} applies "
           "each gradient with those hyper-parameters.")
      .def("recover", &PyClient::Recover, py::arg("arrays"),
           "After a call failed because a shard restarted without a "
           "checkpoint and lost the model: declares it there again, hands it "
           "this worker's copy (arrays: every tensor) and pulls every tensor "
           "afresh into them. False if no shard had lost it.")
      .def("end_step", &PyClient::EndStep, "Completes the step in progress.")
      .def("pull_state", &PyClient::PullState, py::arg("names") = py::none(),
           "The optimizer state on the servers: {name: {slot1, slot2, "
           "steps}} (a slot None where the optimizer keeps none).")
      .def("load_state", &PyClient::LoadState, py::arg("state"),
           "Replaces the optimizer state on the servers ({name: {slot1, "
           "slot2, steps}}); the weights stay.")
      .def("report", &PyClient::Report, py::arg("samples") = 0,
           py::arg("samples_per_second") = 0.0, py::arg("loss") = 0.0,
           py::arg("data_seconds") = 0.0, py::arg("compute_seconds") = 0.0,
           py::arg("exchange_seconds") = 0.0,
           "What the next heartbeats tell the servers of this worker "
           "(psctl status, /metrics show it).")
      .def_property_readonly("mode", &PyClient::mode,
                             "The servers' mode: async, ssp or bsp.")
      .def("leave", &PyClient::Leave, "Tells the servers this worker is done.")
      .def_property_readonly("rank", &PyClient::rank)
      .def_property_readonly("num_workers", &PyClient::num_workers)
      .def_property_readonly("clock", &PyClient::clock)
      .def_property_readonly("tensors", &PyClient::Tensors,
                             "{name: shape} of the declared model.")
      .def_property_readonly("wire_dtypes", &PyClient::WireDtypes,
                             "{name: 'f32', 'bf16' or 'f16'}: the dtype each "
                             "tensor travels in.")
      .def_property_readonly("traffic", &PyClient::Traffic,
                             "{sent_bytes, received_bytes, retries} of this "
                             "client's tensor calls so far.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyClient& self, py::args) { self.Leave(); });
}
