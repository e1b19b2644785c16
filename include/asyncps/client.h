// asyncps's client library: train any model through the parameter servers.
//
// A Client is one worker of a job. It connects to every shard, joins the
// job (a rank, heartbeats, the servers' consistency mode), declares the
// model from named tensors, and pulls weights and pushes gradients by
// tensor name, into and from the caller's own buffers; retries, the wire
// dtype, the partition into slices and membership are handled inside.
//
//   asyncps::ClientOptions options;
//   options.servers = {"localhost:5000", "localhost:5001"};
//   options.rank = 0;
//   options.num_workers = 2;
//   auto client = asyncps::Client::Connect(options);   // joins the job
//   (*client)->Declare({{"w", {784, 10}}, {"b", {10}}}, {w, b}, sgd);
//   for (...) {
//     (*client)->Pull({"w", "b"}, {w, b});              // weights in
//     ... compute gradients gw, gb from w, b ...
//     (*client)->Push({"w", "b"}, {gw, gb});            // gradients out
//     (*client)->EndStep();
//   }
//
// The step: Push sends gradients for step clock() + 1, the step in
// progress (a step's tensors may be pushed in several calls, e.g. as
// backpropagation produces them); EndStep completes it. A Pull waits as
// the servers' mode says: not at all (async), until no worker is more than
// --staleness steps behind (ssp), until step clock() is applied everywhere
// (bsp).
//
// Errors are absl::Status with the server's message (which tensor, which
// rule); a refused call changes no weight. Thread-safe: calls may overlap
// (e.g. a push while the next pull is under way).
//
// This header is the stable API: it names no protobuf or gRPC type.
#ifndef ASYNCPS_INCLUDE_ASYNCPS_CLIENT_H_
#define ASYNCPS_INCLUDE_ASYNCPS_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "asyncps/options.h"

namespace asyncps {

struct ClientOptions {
  std::vector<std::string> servers;  // "host:port" of shard 0, 1, ...
  int rank = -1;                     // -1: the servers assign one.
  int num_workers = 1;               // The job's worker count.
  // async, ssp, bsp: the servers' --mode (a mismatch is
  // FAILED_PRECONDITION naming both); "": adopt the servers' mode.
  std::string mode = "async";
  std::string wire_dtype = "f32";  // f32, bf16, f16: tensors on the wire.
  // How gradients travel to the servers, with error feedback here
  // (docs/COMPRESSION.md): none (the wire dtype), bf16, topk:RATIO (the
  // largest-magnitude fraction, e.g. topk:0.01), onebit (signs and a scale).
  std::string compress = "none";
  std::string transport = "tcp";  // tcp (the data plane) or grpc.
  double rpc_timeout_seconds = 30;
  // How long a shard may stay unreachable before a call fails.
  double retry_for_seconds = 60;
  double heartbeat_seconds = 1;
  // Largest slice a tensor is cut into on the servers (Declare).
  int64_t slice_bytes = 256 << 10;
  // TLS and the job's token (docs/SECURITY.md); empty: none.
  std::string tls_cert, tls_key, tls_ca, auth_token_file;
  // false: a reader (an evaluator, a monitor), which joins no job: it may
  // Attach and Pull, and its pulls never wait; Declare and Push are
  // FAILED_PRECONDITION.
  bool worker = true;
};

// One named tensor of a model. Names are [A-Za-z0-9_./-]+.
struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  // A model buffer (BatchNorm's running statistics): not trained, but
  // averaged: a push carries the worker's current value, and the servers
  // move toward it by 1/live workers (bsp: the mean of the step's values).
  bool buffer = false;
  // This client's dtype for the tensor on the wire (f32, bf16, f16; e.g.
  // a bf16 parameter's own), "" for ClientOptions::wire_dtype. The servers
  // keep f32 master weights either way; the caller's buffers are f32.
  std::string wire_dtype;
};

// What the servers did with a push, summed over the slices it reached.
struct PushStats {
  int64_t slices = 0;
  // Per slice, the updates applied between the pull the gradient was
  // computed from and this push.
  int64_t total_staleness = 0;
  int64_t max_staleness = 0;
  // Slices that did not apply it: late in bsp (the step was done without
  // it), or computed from weights of a shard that has restarted since.
  int64_t dropped = 0;
  // bsp, where dropped: the newest step applied on those slices.
  int64_t front_step = 0;

  void Add(const PushStats& other);
  // total_staleness / slices (0 with no slices).
  double MeanStaleness() const {
    return slices > 0 ? static_cast<double>(total_staleness) /
                            static_cast<double>(slices)
                      : 0.0;
  }
};

// Who trains now (Client::members()).
struct Members {
  // The ranks live now as shard 0 last said (at the registration, then at
  // every heartbeat, ~1 s), ascending; this worker's among them.
  std::vector<int> live_ranks;
  bool elastic = false;  // ps_server --elastic: the job's size changes.
  // The share of the data this worker trains on: `index` of `size`. In a
  // job of fixed size its rank of num_workers; in an elastic one its place
  // among live_ranks and their number, or while the job's first workers
  // are still registering its rank of the size the job started with
  // (docs/ELASTIC.md).
  int index = 0;
  int size = 1;
};

// How much a client has moved: bytes of tensor requests sent and answers
// received, and attempts repeated after a shard was unreachable.
struct TrafficStats {
  int64_t sent_bytes = 0;
  int64_t received_bytes = 0;
  int64_t retries = 0;
};

// Which updates a set of weights includes: what a pull brought, per slice
// of the model (version and the shard incarnation it came from). A push
// names the snapshot its gradients were computed from, so the servers
// measure its staleness and drop it if a shard restarted since. A Client
// keeps one of its own (the latest pull); a worker that pipelines (pushes
// step t while computing on newer weights) keeps its own. Copyable; a
// Snapshot that a call writes (CallOptions::into) must not be used by
// another call at the same time.
class Snapshot {
 public:
  Snapshot();
  ~Snapshot();
  Snapshot(const Snapshot& other);
  Snapshot& operator=(const Snapshot& other);
  Snapshot(Snapshot&& other) noexcept;
  Snapshot& operator=(Snapshot&& other) noexcept;

  // The fewest updates any slice held (-1: nothing pulled yet).
  int64_t min_version() const;
  // The mean updates per slice (0: nothing pulled yet).
  double mean_version() const;

  struct Rep;

 private:
  friend class Client;
  std::unique_ptr<Rep> rep_;
};

// Tensors of the model resolved once (Client::Resolve), for calls on a hot
// path: they take it instead of names and look nothing up. Copyable. It
// belongs to the model it was resolved in: after another Declare or Attach
// a call with it is FAILED_PRECONDITION.
class TensorSet {
 public:
  TensorSet() = default;
  const std::vector<std::string>& names() const { return names_; }
  size_t size() const { return names_.size(); }

 private:
  friend class Client;
  std::vector<std::string> names_;
  std::vector<int> indices_;  // The model's tensor indices, in order.
  int64_t model_ = -1;        // Which adoption of a model it is for.
};

// The explicit form of a call, for workers that pipeline or keep their own
// step count (ps_worker does both). These calls never move clock().
struct CallOptions {
  // Push: the step the gradients are for. Pull: wait for this step as the
  // mode says (bsp: until it is applied everywhere). -1: the implicit step
  // (push clock() + 1, pull clock()).
  int64_t step = -1;
  // Push: the weights the gradients were computed from (null: the
  // client's latest pull).
  const Snapshot* from = nullptr;
  // Pull: also records the versions pulled (and its incarnations tell a
  // bsp shard which weights the caller holds: a shard that restarted since
  // answers ABORTED: push the step's gradient again, then pull with
  // any_incarnation).
  Snapshot* into = nullptr;
  // Pull: do not tell the shards which incarnation the weights held came
  // from (after ABORTED, once the push went again).
  bool any_incarnation = false;
  // Pull (bsp): this pull follows the caller's own push of `step` to these
  // tensors. A shard whose slice still waits for that step without the
  // caller's gradient (lost on the way) answers ABORTED: push it again,
  // then pull.
  bool after_push = false;
  // Push: gets what the servers did (added to what it holds).
  PushStats* stats = nullptr;
  // Push: the hyper-parameters to apply each tensor's gradient with, one
  // per tensor of the call (e.g. a PyTorch param group's, as a scheduler
  // left them); null: the declared ones. Each kind must be the declared
  // kind (INVALID_ARGUMENT otherwise, nothing sent).
  const std::vector<OptimizerOptions>* optimizers = nullptr;
  // Push: these are the same gradients as this worker's last push of
  // these tensors, sent again (bsp, after ABORTED or a step a shard's
  // restart broke off). With ClientOptions::compress each slice goes as it
  // went the first time, so error feedback counts it once.
  bool again = false;
};

// What a worker says of its training; the servers show it (psctl status,
// /metrics) as they show ps_worker's.
struct Progress {
  int64_t samples = 0;            // Examples trained on so far.
  double samples_per_second = 0;  // Recently.
  double loss = 0;                // Of the last step.
  // Seconds spent so far reading data, computing, exchanging.
  double data_seconds = 0;
  double compute_seconds = 0;
  double exchange_seconds = 0;
  double steps_per_second = 0;  // Recently (an outer optimizer's local steps).
};

// One tensor's optimizer state on the servers: `slot1` (momentum's
// velocity, Adam's first moment, Adagrad's sums) and `slot2` (Adam's second
// moment), each empty where the optimizer keeps none, else the tensor's
// element count; `steps`, the updates applied.
struct OptimizerState {
  std::vector<float> slot1, slot2;
  int64_t steps = 0;
};

class Client {
 public:
  // Connects to every shard and joins the job (FAILED_PRECONDITION if the
  // servers run another mode; INVALID_ARGUMENT for a bad option).
  static absl::StatusOr<std::unique_ptr<Client>> Connect(
      const ClientOptions& options);
  // Leaves the job.
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // The model: `tensors`, starting from `initial` (one buffer per tensor,
  // in order, each the tensor's element count), updated by `optimizer`.
  // The first worker to declare creates it with its initial weights; the
  // others' declarations must agree (FAILED_PRECONDITION naming the
  // difference) and their initial weights are not used.
  absl::Status Declare(const std::vector<TensorSpec>& tensors,
                       const std::vector<absl::Span<const float>>& initial,
                       const OptimizerOptions& optimizer,
                       const std::string& model_name = "model");
  // Adopts the model another worker declared, waiting for it (up to
  // retry_for_seconds).
  absl::Status Attach();

  // The weights of tensors `names` into `out` (one buffer per name, each
  // the tensor's element count). NOT_FOUND for an unknown name,
  // INVALID_ARGUMENT for a buffer of the wrong size.
  absl::Status Pull(const std::vector<std::string>& names,
                    const std::vector<absl::Span<float>>& out);
  // Gradients of tensors `names` for the step in progress (clock() + 1),
  // computed from the weights last pulled. INVALID_ARGUMENT for a NaN or
  // infinite gradient (checked before any shard is sent anything), or a
  // buffer of the wrong size; nothing is applied.
  absl::Status Push(const std::vector<std::string>& names,
                    const std::vector<absl::Span<const float>>& grads);
  // Push, then pull the same tensors after the step, in one round trip
  // per shard; ends the step.
  absl::Status PushPull(const std::vector<std::string>& names,
                        const std::vector<absl::Span<const float>>& grads,
                        const std::vector<absl::Span<float>>& out);
  // bsp: this rank has no gradient for `names` in the step in progress (a
  // parameter its graph did not use): each counts it with zero, and its
  // step does not wait for it (docs/MODES.md "A partial step"). Call it
  // before waiting for the step (a pull, PushPull): a rank that waits first
  // may wait for another rank that waits for this. EndStep says it for the
  // tensors not pushed by then. OK and nothing sent in other modes.
  absl::Status PushNoGradient(const std::vector<std::string>& names);
  // Completes the step in progress: in bsp, first says PushNoGradient of
  // every tensor not pushed in it (a failure is returned by the next call);
  // then clock() grows by one.
  void EndStep();
  // What the next heartbeats report of this worker (a reader: nothing).
  void ReportProgress(const Progress& progress);
  // The job's fastest worker's steps_per_second, as the last heartbeat's
  // answer said (0: none known yet; a reader: 0).
  double FastestStepsPerSecond() const;

  // The optimizer state of `names` as the servers hold it now (nothing
  // waits), one per name.
  absl::Status PullOptimizerState(const std::vector<std::string>& names,
                                  std::vector<OptimizerState>* state);
  // Replaces it (one per name; the weights stay). INVALID_ARGUMENT naming
  // the tensor if a slot's size is not what the declared optimizer keeps.
  absl::Status LoadOptimizerState(const std::vector<std::string>& names,
                                  const std::vector<OptimizerState>& state);

  // The same calls in explicit form (CallOptions); PushPull's does not end
  // the step.
  absl::Status Pull(const std::vector<std::string>& names,
                    const std::vector<absl::Span<float>>& out,
                    const CallOptions& options);
  absl::Status Push(const std::vector<std::string>& names,
                    const std::vector<absl::Span<const float>>& grads,
                    const CallOptions& options);
  absl::Status PushPull(const std::vector<std::string>& names,
                        const std::vector<absl::Span<const float>>& grads,
                        const std::vector<absl::Span<float>>& out,
                        const CallOptions& options);

  // `names` resolved once, for the calls below (NOT_FOUND for an unknown
  // name, INVALID_ARGUMENT for one named twice, FAILED_PRECONDITION before
  // Declare or Attach).
  absl::StatusOr<TensorSet> Resolve(
      const std::vector<std::string>& names) const;
  // The explicit calls on a resolved set: one buffer per tensor of `set`,
  // in its order.
  absl::Status Pull(const TensorSet& set,
                    const std::vector<absl::Span<float>>& out,
                    const CallOptions& options);
  absl::Status Push(const TensorSet& set,
                    const std::vector<absl::Span<const float>>& grads,
                    const CallOptions& options);
  absl::Status PushPull(const TensorSet& set,
                        const std::vector<absl::Span<const float>>& grads,
                        const std::vector<absl::Span<float>>& out,
                        const CallOptions& options);
  // Sets the steps completed (a bsp worker whose gradient came back late
  // goes on from the job's front: PushStats::front_step - 1).
  void SetClock(int64_t clock);

  // Recovery from a shard that restarted without a checkpoint and lost the
  // model (calls fail FAILED_PRECONDITION): declares the model there
  // again, hands the shard this worker's copy of its weights (`weights`,
  // every tensor in order, at `snapshot`'s versions) unless another worker
  // did first, and pulls every tensor afresh into `weights` and
  // `snapshot` (the step in flight is lost where it was not applied).
  // Also when another worker recovered the shard first. Returns `failure`
  // itself for any other failure.
  absl::Status Recover(const absl::Status& failure,
                       const std::vector<absl::Span<float>>& weights,
                       Snapshot* snapshot);
  // The same with the client's own snapshot (the implicit form's).
  absl::Status Recover(const absl::Status& failure,
                       const std::vector<absl::Span<float>>& weights);

  int rank() const;
  int num_workers() const;
  // Who trains now, and this worker's share of the data (see Members).
  Members members() const;
  // Steps this worker has completed (a replacement starts where its rank
  // or the job was).
  int64_t clock() const;
  // The declared model's tensors, in order (empty before Declare/Attach).
  std::vector<TensorSpec> tensors() const;
  // The model's name, and the number of shards.
  std::string model_name() const;
  // The job's mode (the servers', when ClientOptions::mode was "").
  std::string mode() const;
  int num_shards() const;
  // The versions of the weights last pulled without CallOptions::into.
  Snapshot latest() const;
  TrafficStats traffic() const;

  // Sparse embedding tables. DeclareEmbedding is idempotent (other options
  // under the name: FAILED_PRECONDITION); making a table is a worker's
  // call, and a reader may declare one that exists, to pull its rows.
  // PullRows writes the rows of `ids` into `rows` (ids.size() x dim, in the
  // ids' order); PushRows applies `grads` (ids.size() x dim; a repeated
  // id's rows are summed into one update of the row), once even if
  // retried; PushPullRows pushes, then pulls the rows of `pull_ids` into
  // `rows` in the same round trip to each shard. A shard restarted
  // without a checkpoint gets the table declared again (its rows start
  // again from their initial values). The mode applies to rows as to
  // tensors (docs/SPARSE.md): pulls carry the clock and pushes the step
  // (clock + 1); ssp may hold a pull; bsp applies each step's mean over the
  // workers and holds a pull until the step before it is applied, and
  // sends every call to every shard. Rows travel over the client's
  // transport and are checkpointed with the model. NOT_FOUND for a
  // table this client has not declared; INVALID_ARGUMENT for an id outside
  // a bounded table, a buffer of the wrong size or a non-finite gradient,
  // with no row changed.
  absl::Status DeclareEmbedding(const std::string& name,
                                const EmbeddingOptions& options);
  absl::Status PullRows(const std::string& name, absl::Span<const int64_t> ids,
                        absl::Span<float> rows);
  absl::Status PushRows(const std::string& name, absl::Span<const int64_t> ids,
                        absl::Span<const float> grads);
  absl::Status PushPullRows(const std::string& name,
                            absl::Span<const int64_t> ids,
                            absl::Span<const float> grads,
                            absl::Span<const int64_t> pull_ids,
                            absl::Span<float> rows);

  // Tells the servers this worker is done (ssp and bsp stop waiting for
  // it). Idempotent; the destructor calls it. A failure of the last
  // EndStep that no call returned (see EndStep) is logged as a WARNING.
  void Leave();

  // The implementation, defined inside the library (not part of the
  // API): a Client is made by Connect, or by the library's own internal
  // targets (ps_worker's, client/worker_client.h).
  class Impl;
  explicit Client(std::unique_ptr<Impl> impl);

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace asyncps

#endif  // ASYNCPS_INCLUDE_ASYNCPS_CLIENT_H_
