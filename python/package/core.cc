// asyncps._core: the client library (include/asyncps/client.h) for Python,
// with pybind11: the bindings of PyClient (python/package/py_client.h says
// how arrays cross and which exceptions a failed call raises).
#include <pybind11/pybind11.h>

#include "python/package/py_client.h"

namespace py = pybind11;

namespace {

using asyncps::PyClient;
using Bound = py::class_<PyClient>;

// Construction, the model, dense pulls and pushes, the bsp step, recover.
void BindDense(Bound& c) {
  c.def(py::init<py::object, int, int, const std::string&, const std::string&,
                 const std::string&, double, double, double, int64_t,
                 const std::string&, const std::string&, const std::string&,
                 const std::string&, bool, const std::string&>(),
        py::arg("servers"), py::arg("rank") = -1, py::arg("num_workers") = 1,
        py::arg("mode") = "async", py::arg("wire_dtype") = "f32",
        py::arg("transport") = "tcp", py::arg("rpc_timeout") = 30.0,
        py::arg("retry_for") = 60.0, py::arg("heartbeat") = 1.0,
        py::arg("slice_bytes") = 256 << 10, py::arg("tls_cert") = "",
        py::arg("tls_key") = "", py::arg("tls_ca") = "",
        py::arg("auth_token_file") = "", py::arg("reader") = false,
        py::arg("compress") = "none")
      .def("declare", &PyClient::Declare, py::arg("arrays"),
           py::arg("optimizer") = "sgd", py::arg("lr") = 0.01f,
           py::arg("momentum") = 0.9f, py::arg("nesterov") = false,
           py::arg("beta1") = 0.9f, py::arg("beta2") = 0.999f,
           py::arg("eps") = 1e-8f, py::arg("weight_decay") = 0.0f,
           py::arg("dampening") = 0.0f, py::arg("lr_decay") = 0.0f,
           py::arg("initial_accumulator_value") = 0.0f, py::arg("delay") = 1,
           py::arg("buffers") = py::none(), py::arg("wire_dtypes") = py::none(),
           "Declares the model {name: initial array}; the first worker's "
           "arrays are the initial weights. `optimizer`: sgd, momentum, "
           "adam, adamw, adagrad, or an outer optimizer (docs/MODES.md "
           "'Outer optimizers'): delayed_nesterov (momentum; `delay` pushes "
           "a momentum update), elastic (lr: EASGD's moving rate). "
           "`buffers`: names of model "
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
      .def("push_no_gradient", &PyClient::PushNoGradient, py::arg("names"),
           "bsp: this rank has no gradient for `names` this step (a "
           "parameter its graph did not use): each counts it as zero and "
           "its step does not wait for it. Call it before waiting for the "
           "step (a pull, push_pull); end_step says it for every tensor "
           "not pushed by then. Does nothing in other modes.")
      .def("end_step", &PyClient::EndStep,
           "Completes the step in progress (in bsp, first push_no_gradient "
           "of the tensors not pushed in it).");
}

// Embedding tables: declare, pull and push rows.
void BindRows(Bound& c) {
  c.def("declare_embedding", &PyClient::DeclareEmbedding, py::arg("name"),
        py::arg("dim"), py::arg("num_rows") = py::none(),
        py::arg("optimizer") = "adagrad", py::arg("lr") = 0.01f,
        py::arg("eps") = 1e-10f, py::arg("beta1") = 0.9f,
        py::arg("beta2") = 0.999f, py::arg("weight_decay") = 0.0f,
        py::arg("initial_accumulator_value") = 0.0f,
        py::arg("init_stddev") = 0.01f, py::arg("max_rows_per_shard") = 0,
        py::arg("seed") = 0, py::arg("admit_count") = 1,
        py::arg("ttl") = py::none(),
        "Declares a sparse embedding table of `dim`-wide rows: ids in "
        "[0, num_rows), or any int64 id if num_rows is None (hashed "
        "features). Rows start N(0, init_stddev^2); the optimizer "
        "(sgd, adagrad, adam: lazy, per-row steps) is applied row by "
        "row. admit_count=N: an id gets a row at its N-th push (the "
        "pushes before are dropped). ttl: a row not pushed for ttl of its "
        "table's pushes on its shard (an int) or for a duration (\"10m\") "
        "is removed (None: never). Idempotent; a reader may declare a "
        "table that exists.")
      .def("pull_rows", &PyClient::PullRows, py::arg("name"), py::arg("ids"),
           "The rows of int64 `ids`: a new float32 array (len(ids), dim), "
           "in the ids' order.")
      .def("push_rows", &PyClient::PushRows, py::arg("name"), py::arg("ids"),
           py::arg("grads"),
           "Pushes float32 row gradients (len(ids), dim); a repeated id's "
           "rows are summed into one update.")
      .def("push_pull_rows", &PyClient::PushPullRows, py::arg("name"),
           py::arg("ids"), py::arg("grads"), py::arg("pull_ids"),
           "push_rows, then the rows of `pull_ids` (e.g. the next batch's) "
           "as pull_rows gives them, in one round trip to each shard.");
}

// Optimizer state, progress, properties and the context manager.
void BindRest(Bound& c) {
  c.def("pull_state", &PyClient::PullState, py::arg("names") = py::none(),
        "The optimizer state on the servers: {name: {slot1, slot2, "
        "steps}} (a slot None where the optimizer keeps none).")
      .def("load_state", &PyClient::LoadState, py::arg("state"),
           "Replaces the optimizer state on the servers ({name: {slot1, "
           "slot2, steps}}); the weights stay.")
      .def("report", &PyClient::Report, py::arg("samples") = 0,
           py::arg("samples_per_second") = 0.0, py::arg("loss") = 0.0,
           py::arg("data_seconds") = 0.0, py::arg("compute_seconds") = 0.0,
           py::arg("exchange_seconds") = 0.0, py::arg("steps_per_second") = 0.0,
           "What the next heartbeats tell the servers of this worker "
           "(psctl status, /metrics show it).")
      .def_property_readonly(
          "fastest_steps_per_second", &PyClient::FastestStepsPerSecond,
          "The job's fastest worker's reported steps_per_second, as the "
          "last heartbeat's answer said (0: none known yet).")
      .def_property_readonly("mode", &PyClient::mode,
                             "The servers' mode: async, ssp or bsp.")
      .def("leave", &PyClient::Leave, "Tells the servers this worker is done.")
      .def_property_readonly("rank", &PyClient::rank)
      .def_property_readonly("num_workers", &PyClient::num_workers)
      .def("members", &PyClient::Members,
           "Who trains now, as shard 0 last said (at the join, then every "
           "heartbeat): {'live_ranks': ascending, 'elastic': whether the job's "
           "size changes (ps_server --elastic), 'index', 'size': this "
           "worker's share of the data (its rank of num_workers, or in an "
           "elastic job its place among live_ranks and their number)}.")
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

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "asyncps's client library (see asyncps.Client).";
  Bound client(m, "Client", R"(One worker of an asyncps job.

Connects to every shard and joins the job (a rank, heartbeats, the
servers' mode); arrays are float32 and C-contiguous, and cross without a
copy. reader=True joins no job: it may attach and pull (an evaluator).)");
  BindDense(client);
  BindRows(client);
  BindRest(client);
}
