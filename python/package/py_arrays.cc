// The conversions of python/package/py_client.h: statuses to Python
// exceptions, and numpy arrays checked and viewed as the client's buffers.
#include <string>

#include "absl/strings/str_cat.h"
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

}  // namespace asyncps
