// Consistency for the embedding tables' rows (server/consistency.h): what
// --mode means for PullRows and PushRows. async applies a push on arrival
// and answers every pull now; ssp holds a row pull by the same rule as a
// dense one (the worker's clock against the slowest live worker's); bsp
// adds a push to its table's step and holds a pull at clock c until the
// table's step c is applied on this shard. A bsp worker sends its row
// pulls and pushes to every shard each step, empty where it has no ids, so
// every shard sees every rank in every step of a table.
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/status_macros.h"
#include "glog/logging.h"
#include "server/consistency.h"

namespace asyncps {

absl::Status Consistency::CheckTables() const {
  if (tables_ == nullptr) {
    return absl::FailedPreconditionError(
        "this shard serves no embedding tables");
  }
  // A replicated shard's tables are served by its primary alone.
  if (replication_ != nullptr) return replication_->CheckServing();
  return absl::OkStatus();
}

absl::Status Consistency::DeclareEmbedding(const v1::EmbeddingSpec& spec,
                                           const absl::Status& may_create) {
  RETURN_IF_ERROR(CheckTables());
  return replication_ != nullptr
             ? replication_->DeclareEmbedding(spec, may_create)
             : tables_->Declare(spec, may_create);
}

absl::Status Consistency::ReadRows(const v1::ReadRowsRequest& request,
                                   v1::ReadRowsResponse* response) {
  RETURN_IF_ERROR(CheckTables());
  return ServeReadRows(tables_, request, response);
}

bool Consistency::RowReady(const RowWait& w) const {
  switch (config_.mode) {
    case Mode::kSsp:
      return SspReady(w.request->clock());
    case Mode::kBsp:
      return w.pull.table->StepApplied(w.request->clock());
    default:
      return true;
  }
}

void Consistency::PullRows(const v1::PullRowsRequest& request,
                           v1::PullRowsResponse* response, PendingCall call) {
  if (absl::Status s = CheckTables(); !s.ok()) {
    call.done(std::move(s));
    return;
  }
  absl::StatusOr<RowPull> pull = ResolvePullRows(
      tables_, store_->shard(), num_shards_, request.table(), request.ids());
  if (!pull.ok()) {
    store_->CountRejected();
    call.done(pull.status());
    return;
  }
  PullResolvedRows(request, *std::move(pull), response->mutable_rows(),
                   std::move(call));
}

void Consistency::PullResolvedRows(const v1::PullRowsRequest& request,
                                   RowPull pull, std::string* rows,
                                   PendingCall call) {
  RowWait w{&request, rows, std::move(pull), absl::InfinitePast()};
  const bool may_wait =
      (config_.mode == Mode::kSsp || config_.mode == Mode::kBsp) &&
      request.rank() >= 0;
  if (!may_wait || RowReady(w)) {
    call.done(FinishPullRows(w.pull, w.rows));
    return;
  }
  if (HoldWithin(&row_waiters_, std::move(w), std::move(call), "row pulls")) {
    RecheckRows(clock_->Now(), nullptr);  // It may have turned ready.
  }
}

void Consistency::PushRows(const v1::PushRowsRequest& request,
                           v1::PushRowsResponse* response, PendingCall call) {
  if (absl::Status s = CheckTables(); !s.ok()) {
    call.done(std::move(s));
    return;
  }
  // The pull half is built (its ids checked) before anything is pushed.
  std::shared_ptr<v1::PullRowsRequest> pull;
  absl::StatusOr<RowPull> resolved;
  if (request.fused() || !request.pull_ids().empty()) {
    pull = std::make_shared<v1::PullRowsRequest>();
    pull->set_table(request.table());
    pull->set_rank(request.rank());
    pull->set_clock(request.clock());
    resolved = ResolvePullRows(tables_, store_->shard(), num_shards_,
                               request.table(), request.pull_ids());
    if (!resolved.ok()) {
      store_->CountRejected();
      call.done(resolved.status());
      return;
    }
  }
  RowPolicy policy;
  policy.bsp = config_.mode == Mode::kBsp;
  policy.quorum = Quorum(membership_->LiveCount());
  policy.now = clock_->Now();
  absl::Status pushed =
      replication_ != nullptr
          ? replication_->PushRows(request, policy, response)
          : ServePushRows(tables_, store_->shard(), num_shards_, request,
                          response, policy);
  if (!pushed.ok()) {
    store_->CountRejected();
    if (IsNonFinite(pushed)) membership_->NoteNonFinite(request.rank());
    call.done(std::move(pushed));
    return;
  }
  // The push may have completed a step (of rows: no dense pull waits on it).
  if (policy.bsp) RecheckRows(clock_->Now(), nullptr);
  if (pull == nullptr) {
    call.done(absl::OkStatus());
    return;
  }
  // The pull half, answered now or held; its request and answer live until
  // the call is answered, which moves the rows into `response`.
  auto pulled = std::make_shared<std::string>();
  call.done = [finish = std::move(call.done), pull, pulled,
               response](absl::Status s) {
    if (s.ok()) response->set_rows(std::move(*pulled));
    finish(std::move(s));
  };
  PullResolvedRows(*pull, *std::move(resolved), pulled.get(), std::move(call));
}

void Consistency::RecheckRows(absl::Time now, absl::flat_hash_set<int>* stuck) {
  std::vector<HeldCalls<RowWait>::Held> ready, expired;
  row_waiters_.Sweep(
      now,
      [this, stuck](const RowWait& w) {
        if (RowReady(w)) return true;
        if (stuck != nullptr) stuck->insert(w.request->rank());
        return false;
      },
      &ready, &expired);
  for (auto& h : ready) {
    if (config_.observer != nullptr) {
      config_.observer->HeldPullAnswered(h.what.request->rank(),
                                         now - h.what.since);
    }
    h.call.done(FinishPullRows(h.what.pull, h.what.rows));
  }
  for (auto& h : expired) {
    h.call.done(absl::DeadlineExceededError(
        absl::StrCat("pull of rows of '", h.what.request->table(),
                     "' held past its deadline: ",
                     config_.mode == Mode::kSsp
                         ? "the slowest live worker is too far behind"
                         : absl::StrCat("step ", h.what.request->clock(),
                                        " of the table was not applied"))));
  }
}

}  // namespace asyncps
