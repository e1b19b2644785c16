// EmbeddingClient: sparse embedding tables on the shards (docs/SPARSE.md):
// declare a table on every shard, pull the rows of a batch's ids and push
// their gradients. Each id goes to the shard RowShard names; a call to
// several shards goes out at once, through a ShardCaller (client/
// shard_caller.h: deadlines, retries, the rank's secret), over the
// client's transport (the data plane, or gRPC).
// A push is checked whole here (ids of a bounded table, finite gradients)
// before any shard gets its part, so a bad push changes no row on any
// shard; a shard that fails mid-call can still leave the others' parts
// applied, as for dense pushes. Pushes are exactly-once (each shard's
// request carries this client's id and a sequence number; a retry gets
// the first answer). A shard that answers NOT_FOUND for a table (it was
// restarted without a checkpoint) gets the table declared again and the
// same requests once more: its rows start again from their initial
// values. The worker's mode and clock go with each call (docs/SPARSE.md
// "Consistency"): pulls carry its clock, pushes the step they are of (the
// clock + 1), as dense calls do; in bsp every shard gets each pull and
// push, empty where the call has no ids for it, so each shard's table
// sees every rank's step.
// In bsp a step's pushes of a table are summed here by id and sent as one
// push per table at the step's end (EndStep): a table looked up twice in a
// step (two features sharing it, two forward calls) keeps every gradient,
// and a declared table this rank did not push in the step gets an empty
// push (it contributes zero to the step's mean) so no step waits for it.
// Thread-safe.
#ifndef ASYNCPS_CLIENT_EMBEDDING_CLIENT_H_
#define ASYNCPS_CLIENT_EMBEDDING_CLIENT_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/shard_caller.h"
#include "common/mode.h"
#include "proto/asyncps.pb.h"

namespace asyncps {

class EmbeddingClient {
 public:
  // The worker's steps, as the rows' calls tell them to the shards.
  struct Steps {
    Mode mode = Mode::kAsync;
    std::function<int64_t()> clock;  // Empty: always 0.
    // The front M at which this worker joined an elastic bsp job (0: it
    // did not). Its first push of a table is of step M + 1, which a shard
    // refuses before step M is applied there; so that push first waits for
    // step M with an empty pull of the table (AwaitJoinedStep).
    std::function<int64_t()> joined_at;
  };

  // `caller` is borrowed and must outlive this client.
  // Without `steps`: async, at clock 0 (a reader's calls).
  explicit EmbeddingClient(ShardCaller* caller) : caller_(caller) {}
  EmbeddingClient(ShardCaller* caller, Steps steps)
      : caller_(caller), steps_(std::move(steps)) {}

  // Declares `spec` on every shard (idempotent). Making a table is a
  // registered worker's call (PERMISSION_DENIED for others); anyone in the
  // job may declare one that is there, as it is, before pulling its rows.
  // The shards' errors: INVALID_ARGUMENT for a bad spec,
  // FAILED_PRECONDITION for another spec under the name.
  absl::Status Declare(const v1::EmbeddingSpec& spec);

  // The rows of `ids` into `rows` (ids.size() x dim, in the ids' order; a
  // repeated id is asked for once). NOT_FOUND for a table this client has
  // not declared; the shards' errors otherwise (an id outside a bounded
  // table, too many ids: nothing changes).
  absl::Status PullRows(const std::string& table, absl::Span<const int64_t> ids,
                        absl::Span<float> rows);
  // Pushes `grads` (ids.size() x dim, row k for ids[k]; a repeated id's
  // rows are summed on its shard). Errors as for PullRows, and a NaN or
  // infinite gradient refused with nothing changed.
  absl::Status PushRows(const std::string& table, absl::Span<const int64_t> ids,
                        absl::Span<const float> grads);
  // In bsp the push is added to the step's sum for the table (checked
  // whole first), and goes out at EndStep; an error of that push is
  // returned by the next call.
  //
  // PushRows, then the rows of `pull_ids` (e.g. the next batch's) into
  // `rows` (pull_ids.size() x dim), in one round trip to each shard; the
  // rows are read after this push is applied on their shard. In bsp that
  // sends the table's sum for the step now (with this push), and reads the
  // rows of the step: a later push of the table in the same step goes out
  // as a second push, which the shards add to the step while it waits.
  absl::Status PushPullRows(const std::string& table,
                            absl::Span<const int64_t> ids,
                            absl::Span<const float> grads,
                            absl::Span<const int64_t> pull_ids,
                            absl::Span<float> rows);

  // bsp: sends each declared table's pushes of the step in progress
  // (clock + 1), summed by id, to every shard, an empty push for a table
  // not pushed in the step. Called before the clock moves on
  // (ClientImpl::EndStep); does nothing in other modes. A failure is also
  // kept for the next call to return.
  absl::Status EndStep();

  // Every row of `table` the shards hold (in no particular order), its id
  // into `ids` and its values into `rows` (ids->size() x dim), read a page
  // at a time without waiting for any step (psctl export). Each shard's
  // part is a snapshot of its table (ReadRowsRequest.snapshot): every row
  // it held at the first page, once, with its values then. Needs no
  // Declare. NOT_FOUND if a shard has no such table.
  absl::Status ReadAll(const std::string& table, std::vector<int64_t>* ids,
                       std::vector<float>* rows);

  // The failure of the last EndStep, returned once (by the next call, or
  // to Client::Impl::Leave).
  absl::Status TakeStepError() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  // ReadAll's part of one shard, from its first page.
  absl::Status ReadShard(int shard, const std::string& table,
                         std::vector<int64_t>* ids, std::vector<float>* rows);
  // Runs `call`; if a shard answers NOT_FOUND (it lost its tables),
  // declares `spec` again and runs `call` once more.
  absl::Status Redeclaring(const v1::EmbeddingSpec& spec,
                           const std::function<absl::Status()>& call);

  // PushRows, and (`fused`) PushPullRows.
  absl::Status Push(const std::string& table, absl::Span<const int64_t> ids,
                    absl::Span<const float> grads,
                    absl::Span<const int64_t> pull_ids, absl::Span<float> rows,
                    bool fused);

  // Sends `ids`' gradients (and, `fused`, pulls `pull_ids` into `rows`)
  // as the step's push of `spec`'s table, to every shard in bsp.
  absl::Status Send(const v1::EmbeddingSpec& spec,
                    absl::Span<const int64_t> ids,
                    absl::Span<const float> grads,
                    absl::Span<const int64_t> pull_ids, absl::Span<float> rows,
                    bool fused);

  // The table's spec, from Declare.
  absl::StatusOr<v1::EmbeddingSpec> Spec(const std::string& table) const;

  // bsp: `ids`' gradients added to the table's sum for the step.
  void AddToStep(const std::string& table, size_t dim,
                 absl::Span<const int64_t> ids, absl::Span<const float> grads)
      ABSL_LOCKS_EXCLUDED(mu_);
  // bsp: takes the table's summed pushes of the step (none: empty) into
  // `ids` and `grads`, marking the table sent for the step.
  void TakeStep(const std::string& table, std::vector<int64_t>* ids,
                std::vector<float>* grads) ABSL_LOCKS_EXCLUDED(mu_);

  int64_t clock() const { return steps_.clock ? steps_.clock() : 0; }
  // bsp: every shard gets each call.
  bool every_shard() const { return steps_.mode == Mode::kBsp; }

  ShardCaller* const caller_;
  const Steps steps_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, v1::EmbeddingSpec> specs_
      ABSL_GUARDED_BY(mu_);
  // bsp: the step in progress's pushes by table (ids in first-pushed
  // order, `at` their index, grads ids.size() x dim), and the tables whose
  // push for the step went out already (PushPullRows).
  struct StepRows {
    std::vector<int64_t> ids;
    absl::flat_hash_map<int64_t, size_t> at;
    std::vector<float> grads;
  };
  absl::flat_hash_map<std::string, StepRows> step_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::string> step_sent_ ABSL_GUARDED_BY(mu_);
  absl::Status step_error_ ABSL_GUARDED_BY(mu_);
  // Tables whose joined step was awaited (Steps::joined_at).
  absl::flat_hash_set<std::string> awaited_ ABSL_GUARDED_BY(mu_);
  absl::Status AwaitJoinedStep(const std::string& table)
      ABSL_LOCKS_EXCLUDED(mu_);
};

}  // namespace asyncps

#endif  // ASYNCPS_CLIENT_EMBEDDING_CLIENT_H_
