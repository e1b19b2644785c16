// The conversions of python/package/py_client.h: statuses to Python
// exceptions, and numpy arrays checked and viewed as the client's buffers.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "python/package/py_client.h"

namespace asyncps {

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

void PyClient::Gradients(py::dict grads, std::vector<std::string>* names,
                         std::vector<py::array>* keep,
                         std::vector<absl::Span<const float>>* views) {
  for (auto [key, value] : grads) {
    names->push_back(py::str(key));
    keep->push_back(Checked(names->back(), value, /*write=*/false));
  }
  for (const py::array& a : *keep) views->push_back(ConstView(a));
}

namespace {

// `ids` as a C-contiguous int64 array (converted if it is not one).
py::array_t<int64_t, py::array::c_style> Ids(py::object ids) {
  py::array_t<int64_t, py::array::c_style> a =
      py::array_t<int64_t, py::array::c_style | py::array::forcecast>::ensure(
          ids);
  if (!a || a.ndim() != 1) {
    throw py::value_error("ids: want a 1-D array of int64 ids");
  }
  return a;
}

}  // namespace

void PyClient::DeclareEmbedding(
    const std::string& name, int64_t dim, py::object num_rows,
    const std::string& optimizer, float lr, float eps, float beta1, float beta2,
    float weight_decay, float initial_accumulator_value, float init_stddev,
    int64_t max_rows_per_shard, uint64_t seed, int admit_count,
    py::object ttl) {
  EmbeddingOptions o;
  o.dim = dim;
  o.num_rows = num_rows.is_none() ? 0 : num_rows.cast<int64_t>();
  if (!num_rows.is_none() && o.num_rows <= 0) {
    throw py::value_error(absl::StrCat("embedding '", name, "': num_rows ",
                                       o.num_rows, " (None: unbounded)"));
  }
  o.optimizer.kind = optimizer;
  o.optimizer.learning_rate = lr;
  o.optimizer.epsilon = eps;
  o.optimizer.beta1 = beta1;
  o.optimizer.beta2 = beta2;
  o.optimizer.weight_decay = weight_decay;
  o.optimizer.initial_accumulator_value = initial_accumulator_value;
  o.init_stddev = init_stddev;
  o.max_rows_per_shard = max_rows_per_shard;
  o.seed = seed;
  o.admit_count = admit_count;
  // ttl: None (never), an int (the table's pushes), or "30s"/"10m"/"2h".
  if (py::isinstance<py::str>(ttl)) {
    absl::Duration d;
    const std::string text = ttl.cast<std::string>();
    if (!absl::ParseDuration(text, &d) || d <= absl::ZeroDuration() ||
        d == absl::InfiniteDuration()) {
      throw py::value_error(absl::StrCat(
          "embedding '", name, "': ttl '", text,
          "' (want a positive duration such as 30s, 10m, 2h; or pushes)"));
    }
    o.ttl_seconds = absl::ToDoubleSeconds(d);
  } else if (!ttl.is_none()) {
    o.ttl_pushes = ttl.cast<int64_t>();
    if (o.ttl_pushes <= 0) {
      throw py::value_error(absl::StrCat("embedding '", name, "': ttl ",
                                         o.ttl_pushes,
                                         " pushes (want >= 1; None: never)"));
    }
  }
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->DeclareEmbedding(name, o);
  }
  Raise(s);
  dims_[name] = dim;
}

py::array_t<float> PyClient::RowsFor(const std::string& name,
                                     py::ssize_t n) const {
  auto it = dims_.find(name);
  if (it == dims_.end()) {
    Raise(absl::NotFoundError(
        absl::StrCat("embedding '", name, "': declare_embedding it first")));
  }
  return py::array_t<float>({n, static_cast<py::ssize_t>(it->second)});
}

py::array PyClient::PullRows(const std::string& name, py::object ids) {
  auto a = Ids(ids);
  py::array_t<float> rows = RowsFor(name, a.size());
  absl::Span<const int64_t> view(a.data(), static_cast<size_t>(a.size()));
  absl::Span<float> out(rows.mutable_data(), static_cast<size_t>(rows.size()));
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->PullRows(name, view, out);
  }
  Raise(s);
  return rows;
}

void PyClient::PushRows(const std::string& name, py::object ids,
                        py::object grads) {
  auto a = Ids(ids);
  py::array g = Checked(name, grads, /*write=*/false);
  absl::Span<const int64_t> view(a.data(), static_cast<size_t>(a.size()));
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->PushRows(name, view, ConstView(g));
  }
  Raise(s);
}

py::array PyClient::PushPullRows(const std::string& name, py::object ids,
                                 py::object grads, py::object pull_ids) {
  auto a = Ids(ids);
  py::array g = Checked(name, grads, /*write=*/false);
  auto p = Ids(pull_ids);
  py::array_t<float> rows = RowsFor(name, p.size());
  absl::Span<const int64_t> push_view(a.data(), static_cast<size_t>(a.size()));
  absl::Span<const int64_t> pull_view(p.data(), static_cast<size_t>(p.size()));
  absl::Span<float> out(rows.mutable_data(), static_cast<size_t>(rows.size()));
  absl::Status s;
  {
    py::gil_scoped_release release;
    s = client_->PushPullRows(name, push_view, ConstView(g), pull_view, out);
  }
  Raise(s);
  return rows;
}

}  // namespace asyncps
