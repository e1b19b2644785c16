// Replication: one member's part in a replicated shard group (ps_server
// --replicas; docs/DESIGN.md "Replicated shards"). The primary applies each
// change (a push, a declare, an assign, a bsp step its housekeeping
// applied, an embedding table declared, a push of rows, a worker's
// registration or leaving) and, under one lock, writes it to every backup
// in the same order; then, without the lock, waits for each backup's
// acknowledgement before the worker hears that the change is done: so an
// acknowledged push is on every member, and the next change goes out
// while this one's acknowledgements come back (the ops are pipelined). A backup
// applies the stream in order through the same ShardStore and push ledger, so
// it holds the same weights, optimizer state, versions, bsp steps and
// remembered push answers (exactly-once survives a failover). A backup joins
// with a snapshot of the primary's whole state, copied in memory under the
// same lock (the only pause a join costs the workers), and sent from that
// copy without it, while the primary goes on serving; the ops of that time
// follow the snapshot on the same connection, and the backup applies them
// once the snapshot is in place. The snapshot travels as bounded chunks
// (server/checkpoint_stream.h) between a start and an end that carries
// their checksum; the backup serves none of it before the end checked out
// (SnapshotIn), and acknowledges the end with the ops it applied after it.
// It counts as in sync (for min_insync, and in the coordinator's record of
// who may be promoted) once it acknowledged every op streamed.
//
// The stream is data-plane frames (transport/frame.h): the backup's
// connection opens with a hello and a kJoin; then the primary writes
// kReplicate frames (a v1::ReplicaOp whose tensors travel as payloads, as a
// worker's push does) and reads v1::ReplicaAcks, each naming the last op
// applied (cumulative: the snapshot's start and chunks get none).
//
// Fencing: each op carries the primary's epoch (the coordinator's revision
// of its election); a backup follows one epoch and drops a stream of any
// other. A primary acknowledges nothing once its lease may have expired
// (lease_deadline), so a deposed primary cannot accept a push after a
// backup could have been promoted. Which role a member has, and when, is
// ReplicaMember's (server/replica/replica_member.h) to decide. Thread-safe.
#ifndef ASYNCPS_SERVER_REPLICATION_H_
#define ASYNCPS_SERVER_REPLICATION_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "proto/asyncps.pb.h"
#include "server/checkpoint_stream.h"
#include "server/embedding_table.h"
#include "server/membership.h"
#include "server/push_ledger.h"
#include "server/replica_snapshot.h"
#include "server/rows.h"
#include "server/shard_store.h"
#include "transport/stream.h"

namespace asyncps {

class Replication {
 public:
  enum class Role {
    kJoining,  // A backup copying the primary's state: serves no one.
    kBackup,   // In the primary's stream: serves no worker.
    kPrimary,  // Serves workers while its lease holds.
    kFenced,   // Lost its lease or its stream: serves no one, ever.
  };
  static const char* RoleName(Role role);

  // `store`, `ledger` and `clock` are borrowed and must outlive this.
  // `member`: this process's address, as the coordinator lists it.
  // `base_policy`: the server's mode and stale policy, with which a backup
  // applies the pushes streamed to it (each op brings the rest).
  // `ack_timeout`: how long a backup may take to acknowledge an op before
  // the primary drops it from the group (it must join again).
  Replication(ShardStore* store, PushLedger* ledger, Clock* clock,
              std::string member, PushPolicy base_policy,
              absl::Duration ack_timeout);
  ~Replication() { Fence("shutting down"); }

  // Told the backups in the stream (their members' names) each time the
  // set changes, before any later change is acknowledged, with the order
  // lock held: ReplicaMember records them with the coordinator, so that
  // only a backup holding every acknowledged change may be promoted. An
  // error fences this member. Set before serving.
  using BackupsChanged =
      std::function<absl::Status(const std::vector<std::string>&)>;
  void set_backups_changed(BackupsChanged f) {
    backups_changed_ = std::move(f);
  }

  // Only a member may join (docs/SECURITY.md): with a member token a join
  // must carry it, and `JoinCheck` (ReplicaMember's: the joiner is listed
  // among the group's members in the coordinator) must pass; otherwise
  // ServeBackup refuses it with PERMISSION_DENIED before any state moves.
  // Both set before serving.
  void set_member_token(std::string token) { member_token_ = std::move(token); }
  // With mutual TLS, a joiner must also present a certificate of `name`
  // (the common name of the members' certificate: the shards' own, which
  // a worker's does not have), else PERMISSION_DENIED. Set before serving.
  void set_member_name(std::string name) { member_name_ = std::move(name); }
  using JoinCheck = std::function<absl::Status(const std::string& member)>;
  void set_join_check(JoinCheck f) { join_check_ = std::move(f); }

  // Role changes (ReplicaMember's). A primary's acknowledgements stop at
  // `lease_deadline`, which each renewal of its lease moves on.
  void BecomeBackup(int64_t epoch, std::string primary);
  void BecomePrimary(int64_t epoch, absl::Time lease_deadline);
  void ExtendLease(absl::Time lease_deadline);
  // The coordinator (etcd) as this member's last call to it found it: OK,
  // or the error, failing since the first such call in a row (Stats:
  // psctl doctor names a member that cannot reach etcd).
  void NoteCoordinator(const absl::Status& status);
  // Stops serving for good and drops every backup; `why` is logged.
  void Fence(const std::string& why);
  Role role() const;
  int64_t epoch() const;
  // Until when this member may acknowledge (a primary's lease, as far as
  // it knows), and when it last became primary (InfinitePast: never).
  absl::Time lease_deadline() const;
  absl::Time promoted_at() const;
  // This member's address (known once its server listens).
  void set_member(std::string member);
  std::string member() const;

  // OK if this member may serve a worker now: the primary, within its
  // lease. Otherwise UNAVAILABLE naming the role and the primary, so that
  // a client tries the group's next member.
  absl::Status CheckServing() const;

  // The fewest members (the primary included) that must hold a change
  // before it is acknowledged (ps_server --min_insync, like Kafka's
  // min.insync.replicas); 1: the primary alone. Set before serving.
  void set_min_insync(int n) { min_insync_ = n; }
  // OK if the primary and its backups in the stream are at least
  // min_insync; else UNAVAILABLE naming the count and the flag. Reads go
  // on below it; changes are refused before they are applied, and one a
  // backup dropped out of while it streamed is applied but not
  // acknowledged (Consistency::Push asks here again before answering a
  // retry from the ledger): no acknowledged change is held by fewer.
  absl::Status CheckInSync() const;

  // Primary: applies a change with the ShardStore (Push with `policy`) and
  // streams it to every backup, in one order; answers once every backup
  // acknowledged it (a backup that fails to is dropped, and the group goes
  // on without it, down to min_insync). UNAVAILABLE, nothing applied, when
  // not serving or below min_insync.
  absl::Status Push(const v1::PushRequest& request, const PushPolicy& policy,
                    v1::PushResponse* response);
  absl::StatusOr<v1::DeclareModelResponse> Declare(
      const v1::DeclareModelRequest& request);
  absl::Status Assign(const v1::AssignRequest& request, bool steps_unknown);

  // The shard's embedding tables (borrowed, outliving this; null: none)
  // and the job's shard count (which ids are this shard's). Set before
  // serving.
  void set_tables(EmbeddingTables* tables, int num_shards) {
    tables_ = tables;
    num_shards_ = num_shards;
  }
  // The shard's membership (borrowed, outliving this; null: not
  // replicated). Set before serving.
  void set_membership(Membership* membership) { membership_ = membership; }
  // Primary: Membership::Register, then the membership streamed (a
  // promoted backup authorizes the worker with its secret). UNAVAILABLE,
  // nothing registered, unless serving; below min_insync it registers (a
  // registration lost with the primary is made again by the worker's
  // heartbeat, and reads need one).
  absl::StatusOr<v1::RegisterResponse> Register(
      const v1::RegisterRequest& request);
  // Primary: streams the membership as it is now (a worker left).
  void MembershipChanged();

  // Primary: EmbeddingTables::Declare, streamed when it made the table.
  absl::Status DeclareEmbedding(const v1::EmbeddingSpec& spec,
                                const absl::Status& may_create);
  // Primary: ServePushRows with `policy`, streamed when it changed the
  // table (a retry answered from the rows' ledger or a refused push is
  // not). UNAVAILABLE, nothing applied, as Push.
  absl::Status PushRows(const v1::PushRowsRequest& request,
                        const RowPolicy& policy,
                        v1::PushRowsResponse* response);
  // Waits until every op streamed so far is acknowledged by the backups
  // (or they dropped out and are recorded so): a retry answered from the
  // push ledger waits here, as its first copy's op may still be on its
  // way. Then CheckServing.
  absl::Status AwaitStreamed();

  // bsp housekeeping of the slices and the tables (AdvanceShardSteps),
  // streamed when it changed anything. Nothing is done unless this member
  // serves.
  ShardStore::StepsAdvanced AdvanceSteps(
      const ShardStore::StepAdvance& advance);

  // Primary, on the data plane: serves a backup that sent `join` on
  // `stream` (after its hello): sends the snapshot, then the stream (from
  // the pushing threads), until the backup is dropped, fails, or this
  // member stops being primary. Returns why it ended.
  absl::Status ServeBackup(Stream* stream, const v1::ReplicaJoin& join);

  // Backup: applies one op of its primary's stream (the snapshot first,
  // which makes a joining member a backup; an op that comes before the
  // snapshot's end is kept, moved from `op`, and applied right after it).
  // `*ack` (if given) gets the op to acknowledge, if any: the last one
  // applied. An error means the stream cannot go on (another epoch, a gap,
  // a change the store refused, the ops kept while joining past
  // set_join_backlog_bytes): the backup must join again from scratch.
  absl::Status Apply(v1::ReplicaOp* op, std::optional<uint64_t>* ack = nullptr);

  v1::ReplicaStats Stats() const;

  // This member's whole state as the ops of a joining backup's snapshot
  // (each of this member's epoch and last op), whatever its role: what a
  // primary fenced for its lease keeps across its restart, in memory (a
  // copy of the shard's state; ReplicaMember::TakeHeldState).
  absl::StatusOr<std::vector<v1::ReplicaOp>> SnapshotOps();

  // The chunk size of the snapshots this primary sends (tests make it
  // tiny). REQUIRES: no backup being served.
  void set_snapshot_chunk_bytes(size_t bytes) { snapshot_chunk_bytes_ = bytes; }
  // The most bytes of ops a joining backup may have yet to receive (the
  // primary's queue while its snapshot goes out) or to apply (the backup's,
  // until the snapshot is in place); past it the primary drops it, or the
  // backup gives up, and it joins again (ps_server --join_backlog_bytes,
  // 2 GiB by default). Set before serving.
  void set_join_backlog_bytes(size_t bytes) { join_backlog_bytes_ = bytes; }

 private:
  // A backup in the stream. Its stream is written by the thread streaming
  // an op (order_mu_ held) and read by the thread serving the backup (its
  // acknowledgements, ReadAcks), each under io_mu: a TLS stream is one
  // state for both directions.
  struct Backup {
    Backup(Stream* s, std::string m, uint64_t at)
        : stream(s), member(std::move(m)), written(at), acked(at) {}
    Stream* const stream;
    const std::string member;
    absl::Mutex io_mu;
    // While its snapshot goes out (`sending`), the ops streamed meanwhile
    // are queued here, copied, and written by its serving thread between
    // chunks; then Broadcast writes to it directly.
    absl::Mutex queue_mu;
    bool sending ABSL_GUARDED_BY(queue_mu) = true;
    std::deque<v1::ReplicaOp> queue ABSL_GUARDED_BY(queue_mu);
    size_t queued_bytes ABSL_GUARDED_BY(queue_mu) = 0;
    // The last op written to it (set before the write).
    std::atomic<uint64_t> written;
    // Under ack_mu_: the last op it acknowledged; in sync (it acknowledged
    // every op streamed once: changes wait for it, the coordinator lists
    // it); dropped from the stream (its socket shut); and, once dropped,
    // whether the backups recorded since (NoteBackups) leave it out.
    uint64_t acked;
    bool in_sync = false;
    bool dropped = false;
    absl::Status dropped_why;
    bool noted = false;
  };
  // A joining backup's snapshot: the shard's whole state, copied under
  // the order lock at op `seq` (CopyState) and sent from here without it.
  struct StateCopy {
    v1::ReplicaOp start;  // The ledgers, the membership, the incarnation.
    bool declared = false;
    v1::ShardCheckpoint head;
    std::vector<v1::SliceCheckpoint> slices;
    // The slices' copy, finished (EncodeState) after the order lock.
    std::unique_ptr<ShardStore::LazyCopy> lazy;
    std::vector<v1::EmbeddingCheckpoint> tables;
  };
  // What a change waits for once it is on the wire: op `seq` acknowledged
  // by each of `to` (the backups it was written to), or they dropped and
  // recorded as gone, by `deadline` (then they are dropped).
  struct Sent {
    uint64_t seq = 0;
    absl::Time deadline;
    std::vector<std::shared_ptr<Backup>> to;
  };
  // Sends `op` (its epoch and seq set here) to every backup, dropping
  // those it cannot be written to (a joining one gets it queued). Called with
  // order_mu_ held, right after the primary applied the change; the change is
  // acknowledged after AwaitAcks, without the order lock, so the next change
  // goes out while this one's acknowledgements come back (ops pipelined, in one
  // order).
  Sent Broadcast(v1::ReplicaOp* op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // Every op streamed so far, as Broadcast's answer: what a change that
  // streamed nothing (a retry answered from a ledger, a declaration
  // already made) waits for, since the op that made it may still be on
  // its way. `joining` (if given) gets the backups not yet in sync.
  Sent Streamed(std::vector<std::shared_ptr<Backup>>* joining = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // Waits until `sent` is acknowledged (a backup that does not by its
  // deadline is dropped) and no dropped backup is still recorded as in
  // sync. Without order_mu_.
  void AwaitAcks(const Sent& sent) ABSL_LOCKS_EXCLUDED(order_mu_);
  // Serving thread of `b`: reads its acknowledgements in order until the
  // stream fails or `b` is dropped; returns why.
  absl::Status ReadAcks(Backup* b) ABSL_LOCKS_EXCLUDED(order_mu_);
  // Writes one op of the stream.
  static absl::Status WriteOp(Stream* stream, v1::ReplicaOp* op,
                              absl::Time deadline);
  // Reads `b`'s next acknowledgement, waiting for it until `deadline`.
  absl::Status ReadNextAck(Backup* b, absl::Time deadline);
  // Serving thread of a joining `b`: writes the ops queued for it, with
  // `last` (the snapshot went out) Broadcast writes to it from then on.
  absl::Status FlushQueue(Backup* b, bool last);
  // Serving thread of a joining `b`: reads its acknowledgements until it
  // has nearly every op streamed, then, under the order lock, the rest,
  // and counts it in sync; `*how` says how that went, for the log.
  absl::Status CatchUp(Backup* b, std::string* how)
      ABSL_LOCKS_EXCLUDED(order_mu_);
  // Drops `b` from the stream (its socket shut): its serving thread then
  // records the backups without it.
  void Drop(Backup* b, const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(ack_mu_);
  // Tells backups_changed_ the backups not dropped; fences on its error.
  void NoteBackups() ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // UNAVAILABLE unless primary within its lease.
  absl::Status CheckPrimaryLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // CheckServing, then CheckInSync (both under mu_).
  absl::Status CheckWritable() const;
  absl::Status CheckInSyncLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The shard's whole state into `copy`, reusing its buffers: under the
  // order lock, a consistent copy; once before, without it, to size (and
  // fault in) those buffers, so that the copy under the lock is a memcpy.
  absl::Status CopyState(StateCopy* copy);
  // The snapshot's ops made from `copy` (start, chunks, end: its contents
  // taken), each given to `send` in turn; returns the chunks' bytes.
  absl::StatusOr<uint64_t> EncodeState(
      StateCopy* copy, const std::function<absl::Status(v1::ReplicaOp*)>& send);
  // Sends a joining backup its snapshot from `copy` (each op numbered as
  // the op it was copied at, of `epoch`), the ops queued meanwhile between
  // chunks; returns the chunks' bytes.
  absl::StatusOr<uint64_t> SendSnapshot(Backup* b, StateCopy* copy,
                                        int64_t epoch)
      ABSL_LOCKS_EXCLUDED(order_mu_);
  // Streams the membership as it is now (after a registration or a
  // worker's leaving).
  Sent BroadcastMembership() ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // FAILED_PRECONDITION unless this shard serves embedding tables.
  absl::Status CheckTables() const;
  // Backup: applies a streamed push with the primary's policy, through
  // the ledger (one streamed twice breaks the stream).
  absl::Status ApplyPush(const v1::ReplicaOp& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // Backup: applies a streamed table's declaration, or push of rows with
  // the primary's policy.
  absl::Status ApplyTableOp(const v1::ReplicaOp& op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // Backup: applies one op of the snapshot (start, chunk, end); true once
  // it is whole and in place.
  absl::StatusOr<bool> ApplySnapshot(v1::ReplicaOp* op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // Backup: applies one op of the stream (not the snapshot's).
  absl::Status ApplyOp(v1::ReplicaOp* op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);
  // Backup, joining: keeps `op` (moved) until the snapshot is in place.
  absl::Status KeepForLater(v1::ReplicaOp* op)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(order_mu_);

  ShardStore* const store_;
  PushLedger* const ledger_;
  EmbeddingTables* tables_ = nullptr;
  int num_shards_ = 1;
  Membership* membership_ = nullptr;
  Clock* const clock_;
  const PushPolicy base_policy_;
  const absl::Duration ack_timeout_;
  BackupsChanged backups_changed_;
  std::string member_token_;
  std::string member_name_;
  JoinCheck join_check_;
  size_t snapshot_chunk_bytes_ = kCheckpointChunkBytes;
  size_t join_backlog_bytes_ = size_t{2} << 30;
  int min_insync_ = 1;

  // Held while a change is applied and written to the backups: the one
  // order.
  absl::Mutex order_mu_ ABSL_ACQUIRED_BEFORE(mu_);
  uint64_t seq_ ABSL_GUARDED_BY(order_mu_) = 0;  // Primary: ops streamed.
  // Backup: the snapshot coming in, between its start and end, and the
  // membership its start carried (imported at the end).
  std::unique_ptr<SnapshotIn> joining_ ABSL_GUARDED_BY(order_mu_);
  v1::MembershipState joining_membership_ ABSL_GUARDED_BY(order_mu_);
  // Backup, joining: the op the snapshot was taken at, and the ops that
  // came after it, kept until it is in place (their bytes).
  uint64_t joining_seq_ ABSL_GUARDED_BY(order_mu_) = 0;
  std::deque<v1::ReplicaOp> backlog_ ABSL_GUARDED_BY(order_mu_);
  size_t backlog_bytes_ ABSL_GUARDED_BY(order_mu_) = 0;

  mutable absl::Mutex mu_;
  std::string member_ ABSL_GUARDED_BY(mu_);
  Role role_ ABSL_GUARDED_BY(mu_) = Role::kJoining;
  int64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::string primary_ ABSL_GUARDED_BY(mu_);
  absl::Time lease_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // The last op applied (backup) or streamed (primary).
  uint64_t applied_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t failovers_ ABSL_GUARDED_BY(mu_) = 0;
  std::string coordinator_error_ ABSL_GUARDED_BY(mu_);  // "": reachable.
  absl::Time coordinator_failing_since_ ABSL_GUARDED_BY(mu_);
  absl::Time promoted_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  std::vector<std::string> backup_names_ ABSL_GUARDED_BY(mu_);
  // The backups in the stream and their acknowledgements; the list
  // changes only with order_mu_ held too.
  mutable absl::Mutex ack_mu_ ABSL_ACQUIRED_AFTER(mu_);
  std::vector<std::shared_ptr<Backup>> backups_ ABSL_GUARDED_BY(ack_mu_);
  // Backups dropped and not yet noted: no change is acknowledged while
  // the coordinator may still list one of them as in sync.
  int unnoted_drops_ ABSL_GUARDED_BY(ack_mu_) = 0;
  // Refusals for want of min_insync (Stats' below_min_insync).
  mutable std::atomic<int64_t> below_min_insync_{0};
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICATION_H_
