#include "python/package/py_client.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace asyncps {

PyClient::PyClient(py::object servers, int rank, int num_workers,
                   const std::string& mode, const std::string& wire_dtype,
                   const std::string& transport, double rpc_timeout,
                   double retry_for, double heartbeat, int64_t slice_bytes,
                   const std::string& tls_cert, const std::string& tls_key,
                   const std::string& tls_ca,
                   const std::string& auth_token_file, bool reader,
                   const std::string& compress) {
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
  o.compress = compress;
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

void PyClient::Declare(py::dict arrays, const std::string& optimizer, float lr,
                       float momentum, bool nesterov, float beta1, float beta2,
                       float eps, float weight_decay, float dampening,
                       float lr_decay, float initial_accumulator_value,
                       int delay, py::object buffers, py::object wire_dtypes) {
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
  opt.delay = delay;
  kind_ = optimizer;
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->Declare(tensors, initial, opt);
  }
  resolved_.clear();  // The model's sets are resolved anew.
  Raise(s);
}

void PyClient::Attach() {
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->Attach();
  }
  resolved_.clear();
  Raise(s);
}

py::dict PyClient::Pull(py::object names) {
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

void PyClient::PullIntoArrays(py::dict arrays) {
  std::vector<std::string> names;
  std::vector<py::array> keep;
  for (auto [key, value] : arrays) {
    names.push_back(py::str(key));
    keep.push_back(Checked(names.back(), value, /*write=*/true));
  }
  PullInto(names, &keep);
}

void PyClient::PushNoGradient(const std::vector<std::string>& names) {
  if (names.empty()) return;
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->PushNoGradient(names);
  }
  Raise(s);
}

py::dict PyClient::Push(py::dict grads, py::object hyper) {
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
  const std::shared_ptr<const TensorSet> set = Resolved(names);
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->Push(*set, views, options);
  }
  Raise(s);
  py::dict out;
  out["slices"] = stats.slices;
  out["staleness"] = stats.total_staleness;
  out["max_staleness"] = stats.max_staleness;
  out["dropped"] = stats.dropped;
  return out;
}

py::dict PyClient::PushPull(py::dict grads) {
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
  const std::shared_ptr<const TensorSet> set = Resolved(names);
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->PushPull(*set, views, out_views, CallOptions());
    if (s.ok()) client_->EndStep();
  }
  Raise(s);
  return out;
}

void PyClient::PushPullInto(py::dict grads, py::dict out, py::object hyper) {
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
  const std::shared_ptr<const TensorSet> set = Resolved(names);
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->PushPull(*set, views, out_views, options);
  }
  Raise(s);
}

void PyClient::Report(int64_t samples, double samples_per_second, double loss,
                      double data_seconds, double compute_seconds,
                      double exchange_seconds, double steps_per_second) {
  Progress p;
  p.steps_per_second = steps_per_second;
  p.samples = samples;
  p.samples_per_second = samples_per_second;
  p.loss = loss;
  p.data_seconds = data_seconds;
  p.compute_seconds = compute_seconds;
  p.exchange_seconds = exchange_seconds;
  client_->ReportProgress(p);
}

py::dict PyClient::Tensors() const {
  py::dict out;
  for (const TensorSpec& t : client_->tensors()) {
    out[py::str(t.name)] = py::tuple(py::cast(t.shape));
  }
  return out;
}

py::dict PyClient::WireDtypes() const {
  py::dict out;
  for (const TensorSpec& t : client_->tensors()) {
    out[py::str(t.name)] = py::str(t.wire_dtype);
  }
  return out;
}

py::dict PyClient::Traffic() const {
  const TrafficStats t = client_->traffic();
  py::dict out;
  out["sent_bytes"] = t.sent_bytes;
  out["received_bytes"] = t.received_bytes;
  out["retries"] = t.retries;
  return out;
}

bool PyClient::Recover(py::dict arrays) {
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

std::vector<std::string> PyClient::Names(py::object names) const {
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

PyClient::ShapeMap PyClient::Shapes() const {
  ShapeMap shapes;
  for (const TensorSpec& t : client_->tensors()) {
    shapes[t.name] = {t.shape.begin(), t.shape.end()};
  }
  return shapes;
}

void PyClient::PullInto(const std::vector<std::string>& names,
                        std::vector<py::array>* arrays) {
  std::vector<absl::Span<float>> views;
  for (py::array& a : *arrays) views.push_back(View(a));
  const std::shared_ptr<const TensorSet> set = Resolved(names);
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->Pull(*set, views, CallOptions());
  }
  Raise(s);
}

std::shared_ptr<const TensorSet> PyClient::Resolved(
    const std::vector<std::string>& names) {
  const std::string key = absl::StrJoin(names, "\n");
  auto it = resolved_.find(key);
  if (it != resolved_.end()) return it->second;
  absl::StatusOr<TensorSet> set = client_->Resolve(names);
  Raise(set.status());
  if (resolved_.size() >= kMaxResolved) resolved_.clear();
  auto shared = std::make_shared<const TensorSet>(*std::move(set));
  resolved_[key] = shared;
  return shared;
}

}  // namespace asyncps
