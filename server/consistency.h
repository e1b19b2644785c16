// Consistency: the server side of --mode. Decides how a push is applied
// (async, ssp: on arrival, with the stale policy; bsp: averaged per step
// over the live workers, less backup workers, once the expected workers
// have all joined) and whether a pull is answered
// now or held (ssp: until the puller is within `staleness` clocks of the
// slowest live worker, workers expected but not yet registered counting as
// clock 0; bsp: until the puller's step is applied). Tick(),
// which the server calls on a period, re-checks held pulls, applies bsp steps
// whose stragglers died or missed --step_deadline, and logs workers that go
// silent or come back. The embedding tables' rows follow the same mode
// (consistency_rows.cc): ssp holds a row pull as a dense one, bsp adds a
// row push to its table's step and holds a row pull until the step before
// it is applied. No gRPC here: held pulls are PendingCalls.
// Thread-safe.
#ifndef ASYNCPS_SERVER_CONSISTENCY_H_
#define ASYNCPS_SERVER_CONSISTENCY_H_

#include <atomic>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/mode.h"
#include "proto/asyncps.pb.h"
#include "server/held_calls.h"
#include "server/held_pull_observer.h"
#include "server/membership.h"
#include "server/push_ledger.h"
#include "server/replication.h"
#include "server/rows.h"
#include "server/shard_store.h"

namespace asyncps {

struct ConsistencyConfig {
  Mode mode = Mode::kAsync;
  int64_t staleness = 0;   // ssp.
  int backup_workers = 0;  // bsp: a step needs live - backup_workers.
  absl::Duration step_deadline = absl::ZeroDuration();  // bsp; 0: none.
  StalePolicy stale;                                    // async, ssp.
  // How long a shard that lost its model waits for a worker's copy (see
  // Declare) before it serves the initial weights.
  absl::Duration restore_wait = absl::Seconds(10);
  // A held pull (an ssp clock or a bsp step) waiting longer than this is
  // logged once, naming the ranks it waits for (the stall doctor); 0: never.
  absl::Duration stall_warn = absl::Seconds(10);
  // bsp healing: a pending step whose first gradient is older than this,
  // and whose missing live ranks are all blocked in held pulls here, is
  // applied without them (counted as short, logged); 0: never. Keep it
  // below the workers' --retry_for, so no worker gives up on a step that
  // can still complete.
  absl::Duration heal_after = absl::Seconds(15);
  // Tests only: every n-th push is applied and then answered UNAVAILABLE,
  // as if its answer were lost on the way (0: never).
  int lose_every_nth_answer = 0;
  // The most pulls one rank may have held at once on this shard; more are
  // RESOURCE_EXHAUSTED (a worker holds one per layer at most; a client
  // holding thousands would only eat the shard's memory).
  int max_held_per_rank = 64;
  // Told how long each held pull waited (metrics); borrowed, may be null.
  HeldPullObserver* observer = nullptr;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Validate() const;
};

class Consistency {
 public:
  // `store`, `membership`, `clock` and `tables` (may be null: no rows
  // served) are borrowed and must outlive this. `num_shards`: the job's,
  // for the rows' RowShard.
  Consistency(ConsistencyConfig config, ShardStore* store,
              Membership* membership, Clock* clock,
              EmbeddingTables* tables = nullptr, int num_shards = 1);
  ~Consistency() { Shutdown(); }

  // Answers `call` with `request`'s weights in `*response` now, or holds it
  // until it may be answered (or its deadline passes: DEADLINE_EXCEEDED).
  // `request` and `response` must stay valid until the call is answered.
  void Pull(const v1::PullRequest& request, v1::PullResponse* response,
            PendingCall call);
  // Applies a push once: a retry of one already applied (same client id and
  // sequence) is answered as the first was (PushLedger).
  absl::Status Push(const v1::PushRequest& request, v1::PushResponse* response);
  // Push, then Pull of the pushed slices in `request.weights_dtype()`; on
  // a push error `call` is answered with it and nothing was applied.
  // `request` and `response` must stay valid until the call is answered.
  void PushPull(const v1::PushPullRequest& request,
                v1::PushPullResponse* response, PendingCall call);
  // Answers `call` with the rows of `request.ids()` now, or holds it: ssp
  // as Pull; bsp until the table's step `request.clock()` is applied here.
  // A reader's (rank -1) is never held. Bad ids are refused at once.
  // `request` and `response` must stay valid until the call is answered.
  void PullRows(const v1::PullRowsRequest& request,
                v1::PullRowsResponse* response, PendingCall call);
  // Pushes the rows (ServePushRows: once per client id and sequence; bsp:
  // into the table's step `request.clock()`), then, with pull_ids, pulls
  // them as PullRows at the push's clock into response->rows (held in ssp
  // and bsp). Bad pull ids are refused before anything is pushed.
  void PushRows(const v1::PushRowsRequest& request,
                v1::PushRowsResponse* response, PendingCall call);
  // EmbeddingTables::Declare (`may_create`: the caller's right to make a
  // table), and ServeReadRows; through the primary on a replicated shard,
  // which streams a table it made to its backups.
  absl::Status DeclareEmbedding(const v1::EmbeddingSpec& spec,
                                const absl::Status& may_create);
  absl::Status ReadRows(const v1::ReadRowsRequest& request,
                        v1::ReadRowsResponse* response);
  // Declares the model (ShardStore::Declare). With `recover` and a model
  // created by this call, the shard lost its weights at a restart: pulls
  // and pushes are answered UNAVAILABLE until a worker's copy has come
  // (Assign with restore) or restore_wait has passed. With
  // `weights_follow`, the same wait for the declarer's initial weights.
  absl::StatusOr<v1::DeclareModelResponse> Declare(
      const v1::DeclareModelRequest& request);
  // Assign: the workers' weights in allreduce mode, or a worker's copy of
  // a lost model (restore); FAILED_PRECONDITION otherwise.
  absl::Status Assign(const v1::AssignRequest& request);
  // True while the shard waits for a worker's copy of its lost model.
  bool AwaitingRestore();

  // A job checkpoint (CheckpointRequest): until Resume, or `lease` from
  // now, pushes are answered UNAVAILABLE (clients retry them), but, in
  // bsp, those for steps up to `until_step`.
  void Pause(int64_t until_step, absl::Duration lease);
  void Resume();

  // A worker's clock moved (heartbeat): held pulls may go.
  void ClockAdvanced() { Recheck(); }

  // The server's housekeeping, called on a period: logs liveness changes,
  // applies bsp steps that may go, answers held pulls that may go or whose
  // deadline passed.
  void Tick();
  // Answers every held pull, and every later one that would be held, with
  // UNAVAILABLE (clients retry). Call before the transport shuts down.
  void Shutdown();

  const ConsistencyConfig& config() const { return config_; }
  // A replicated shard's member (server/replication.h), borrowed: pushes,
  // declares and assigns go through it (the primary streams them to its
  // backups), and nothing is served unless it is the primary. Set before
  // serving.
  void set_replication(Replication* replication) { replication_ = replication; }
  Replication* replication() const { return replication_; }
  // Membership::Register and Heartbeat; on a replicated shard a
  // registration, and a worker's leaving, stream to the backups (a promoted
  // backup knows the job's workers and their secrets).
  absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request);
  // `response` gets the job's fastest worker's rate
  // (Membership::FastestStepsPerSecond).
  absl::Status Heartbeat(const v1::HeartbeatRequest& request,
                         v1::HeartbeatResponse* response);
  // OK unless this shard is a replicated group's member that is not its
  // primary now (then UNAVAILABLE naming the primary): what calls that
  // touch no weights (Register, Heartbeat) check.
  absl::Status ReplicaServing() const {
    return replication_ == nullptr ? absl::OkStatus()
                                   : replication_->CheckServing();
  }
  // The push ledger, which a replicated shard's snapshot carries.
  PushLedger* ledger() { return &ledger_; }
  // What the longest-held pull has waited for past --stall_warn (who it
  // waits for, when each was last seen); "" when nothing is stalled.
  std::string Stall();
  // How long the longest-held pull has waited (zero when none is held), as
  // of the last housekeeping tick.
  absl::Duration OldestHeld();
  // Pulls held since the start, and held now.
  int64_t held_pulls() const { return held_total_.load(); }
  size_t waiting() { return waiters_.size(); }

 private:
  // INVALID_ARGUMENT for an outer optimizer (IsOuterOptimizer) this mode or
  // stale policy cannot run: bsp and allreduce; EASGD with any stale
  // policy; DC-ASGD with either.
  absl::Status CheckOuterOptimizer(const v1::OptimizerSpec& optimizer) const;

  struct Wait {
    const v1::PullRequest* request;
    v1::PullResponse* response;
    std::vector<int> slices;
    absl::Time since;  // When it began to wait.
  };
  // The longest-held pull's rank, clock and start.
  struct Oldest {
    int rank = -1;
    int64_t clock = 0;
    absl::Time since = absl::InfiniteFuture();
  };
  // Looks at the longest-held pull; past stall_warn, describes whom it
  // waits for (logged once per waiting pull).
  void DiagnoseStall(const Oldest& oldest);
  bool Ready(const Wait& w) const;
  // The ABORTED answer to a pull whose step waits for the caller's own
  // gradient, which never came (see MustPushAgain).
  static absl::Status PushAgain(int shard, int rank, int64_t clock);
  // bsp: `w` follows its rank's push of its step, and a slice it waits on
  // lacks that gradient: the rank is asked to push it again (ABORTED).
  bool MustPushAgain(const Wait& w) const;
  // bsp: catches up with the step the job has completed, then applies
  // steps that may go (quorum, --step_deadline, healing).
  void AdvanceSteps();
  // UNAVAILABLE while awaiting a restore or, replicated, while this member
  // is not the primary; else OK.
  absl::Status CheckServing();
  // UNAVAILABLE while awaiting a restore, else OK.
  absl::Status CheckRestored();
  // True until every worker the job expects has joined (here, or before
  // this shard restarted); meanwhile bsp and ssp wait for the missing ones.
  bool Joining() const;
  int Quorum(int live) const;
  // A rank's held pulls of slices: the lowest step they wait for, and
  // since when the first of them waits.
  struct HeldSince {
    int64_t clock = 0;
    absl::Time since = absl::InfiniteFuture();
  };
  using HeldByRank = absl::flat_hash_map<int, HeldSince>;
  // Answers every held pull that may go, or whose deadline passed; returns
  // the longest-held of those still waiting.
  // `stuck`, if given, gets the ranks with a pull still held (of slices or
  // rows); `held`, if given, each rank's held pulls of slices.
  Oldest Recheck(absl::flat_hash_set<int>* stuck = nullptr,
                 HeldByRank* held = nullptr);
  // bsp healing: the step every live rank has waited for, each for at least
  // --heal_after, in a pull held without any gradient of it coming (the
  // lowest step they wait for); -1 if some live rank waits less or not at
  // all. No rank will send a gradient of that step: it is skipped.
  int64_t StepNobodySends(const std::vector<int>& live_ranks,
                          const HeldByRank& held, absl::Time now) const;

  // A held pull of rows.
  struct RowWait {
    const v1::PullRowsRequest* request;
    std::string* rows;  // Where the answer goes.
    RowPull pull;
    absl::Time since;
  };
  // Holds `w` (a Wait or a RowWait) in `list`, from now, unless its rank
  // already has max_held_per_rank calls there: then `call` is answered
  // RESOURCE_EXHAUSTED, naming `what` ("pulls", "row pulls"), counted as
  // rejected, and false is returned.
  template <typename T>
  bool HoldWithin(HeldCalls<T>* list, T w, PendingCall call,
                  absl::string_view what) {
    w.since = clock_->Now();
    const int rank = w.request->rank();
    typename HeldCalls<T>::Held held{std::move(w), std::move(call)};
    if (!list->HoldIfFewer(
            &held, static_cast<size_t>(config_.max_held_per_rank),
            [rank](const T& h) { return h.request->rank() == rank; })) {
      store_->CountRejected();
      held.call.done(absl::ResourceExhaustedError(absl::StrCat(
          "rank ", rank, " already has ", config_.max_held_per_rank, " ", what,
          " held on shard ", store_->shard(),
          ", the most one rank may; wait for one to be answered")));
      return false;
    }
    held_total_.fetch_add(1);
    return true;
  }
  // PullRows of a pull resolved already; its rows go to `rows`.
  void PullResolvedRows(const v1::PullRowsRequest& request, RowPull pull,
                        std::string* rows, PendingCall call);
  // ssp: true if a pull at `clock` may go now.
  bool SspReady(int64_t clock) const;
  bool RowReady(const RowWait& w) const;
  // Answers held row pulls that may go or expired; ranks still held into
  // `stuck` (if given).
  void RecheckRows(absl::Time now, absl::flat_hash_set<int>* stuck);
  // FAILED_PRECONDITION when this shard serves no tables; UNAVAILABLE
  // (as CheckServing) from a replicated shard's member that is not its
  // primary.
  absl::Status CheckTables() const;

  // Constant after construction.
  const ConsistencyConfig config_;
  ShardStore* const store_;
  Membership* const membership_;
  Clock* const clock_;
  EmbeddingTables* const tables_;
  const int num_shards_;
  Replication* replication_ = nullptr;

  std::atomic<int64_t> held_total_{0};
  std::atomic<int64_t> pushes_seen_{0};     // For lose_every_nth_answer.
  std::atomic<bool> awaiting_fast_{false};  // awaiting_, read without a lock.
  PushLedger ledger_;
  HeldCalls<Wait> waiters_;
  HeldCalls<RowWait> row_waiters_;

  std::atomic<bool> paused_fast_{false};
  absl::Mutex stall_mu_;
  std::string stall_ ABSL_GUARDED_BY(stall_mu_);
  absl::Duration oldest_held_ ABSL_GUARDED_BY(stall_mu_);
  std::pair<int, int64_t> warned_ ABSL_GUARDED_BY(stall_mu_) = {-1, -1};

  absl::Mutex pause_mu_;
  bool paused_ ABSL_GUARDED_BY(pause_mu_) = false;
  int64_t pause_until_step_ ABSL_GUARDED_BY(pause_mu_) = 0;
  absl::Time pause_until_ ABSL_GUARDED_BY(pause_mu_);
  // UNAVAILABLE if `push` must wait for the end of a pause.
  absl::Status CheckPaused(const v1::PushRequest& push);

  absl::Mutex restore_mu_;
  // Set while a lost model awaits a worker's copy: until when, and which
  // of its slices have come.
  bool awaiting_ ABSL_GUARDED_BY(restore_mu_) = false;
  // What it awaits: a new model's initial weights (DeclareModelRequest.
  // weights_follow), not a lost one's copy.
  bool awaiting_initial_ ABSL_GUARDED_BY(restore_mu_) = false;
  absl::Time await_until_ ABSL_GUARDED_BY(restore_mu_);
  int64_t restored_slices_ ABSL_GUARDED_BY(restore_mu_) = 0;
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_CONSISTENCY_H_
