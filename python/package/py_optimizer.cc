// PyClient's optimizer side (declared in python/package/py_client.h): the
// optimizer state pulled and loaded as dicts of arrays, and the
// hyper-parameters a push carries, read from Python dicts.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "python/package/py_client.h"

namespace asyncps {

py::dict PyClient::PullState(py::object names) {
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

void PyClient::LoadState(py::dict state) {
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

std::vector<OptimizerOptions> PyClient::HyperFor(
    const std::vector<std::string>& names, py::object hyper) const {
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

OptimizerOptions PyClient::Hyper(const std::string& name,
                                 py::handle value) const {
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
    } else if (key == "delay") {
      o.delay = v.cast<int>();
    } else {
      throw py::value_error(absl::StrCat(
          "tensor '", name, "': unknown hyper-parameter '", key, "'"));
    }
  }
  return o;
}

}  // namespace asyncps
