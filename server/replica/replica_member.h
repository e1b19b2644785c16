// ReplicaMember: one process of a replicated shard group (ps_server
// --replicas): a ShardServer whose Replication (server/replication.h) it
// drives from a Coordinator (etcd, or in memory for tests). It holds a
// lease; it campaigns for the group's primary key with that lease (the
// key's create revision is the epoch); as a backup it joins the primary's
// stream over the data plane and follows it. Keys, under
// `<prefix>/shard/<s>/`:
//
//   primary      the primary's address, bound to its lease (gone with it)
//   insync       "<epoch>:<backup>,<backup>": the backups holding every
//                acknowledged change (the primary updates it before it
//                acknowledges anything more when the set shrinks)
//   incarnation  the group's, shared by every member (ShardStore's)
//   members/<m>  each member's role, bound to its lease (psctl status)
//
// Every record a member writes is a transaction (Coordinator::PutIf): a
// primary's (`insync`, its promotion, the job's "done") holds only while
// the primary key's create revision is its epoch, so a primary that wakes
// from a pause past its lease cannot overwrite its successor's records;
// the group-lost record only while there is no primary and `insync` is as
// the member read it. (`members/<m>` is each member's own status, bound to
// its own lease.)
//
// Who may be promoted: a backup listed in `insync` for the epoch it
// followed, as soon as the primary key is gone. A backup whose stream
// broke and that finds nothing of its primary answering (the process is
// gone: its port refuses, or a process started in its place answers)
// removes the key itself, fenced on the epoch and on `insync` as it read
// it, and campaigns at once (DeposeDeadPrimary); otherwise (no answer: a
// partition) the primary's lease expiring is the backstop. A member with no
// state may be promoted only while the group has none (epoch 0 in
// `insync`). A group with no
// records at all (never created, or the coordinator lost them) has no
// leader: a member does not start (ReplicaConfig::bootstrap,
// server/replica/group_records.h), and one running refuses to campaign. After
// `join_wait` with no primary, a member with no state takes the group as
// lost (every member holding its state is gone): it writes a new
// incarnation and epoch 0, and starts again; the workers' copy then
// restores the weights, as after a restart without a checkpoint. A member that
// loses its lease, its stream, or an election it could not win with its
// state ends (Ended()); ps_server then starts a fresh one in its place,
// which joins as a backup. Thread-safe.
//
// Time: the lease, the election's waits and Replication::CheckServing all
// read the Env's clock, so a test can move them together (a ManualClock).
// What the operating system or gRPC enforces (the join's connect and RPC
// deadlines, a frame's deadline on the stream) and the loop's pause between
// rounds stay on real time.
#ifndef ASYNCPS_SERVER_REPLICA_REPLICA_MEMBER_H_
#define ASYNCPS_SERVER_REPLICA_REPLICA_MEMBER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/env.h"
#include "server/replica/coordinator.h"
#include "server/shard_server.h"
#include "transport/stream.h"

namespace asyncps {

// What a primary fenced for its lease held (ReplicaMember::TakeHeldState):
// every change acknowledged in its epoch, as a snapshot's ops.
struct HeldState {
  int64_t epoch = 0;
  std::vector<v1::ReplicaOp> snapshot;
};

struct ReplicaConfig {
  // Keys live under `prefix` (e.g. "/asyncps/<job>").
  std::string prefix = "/asyncps/default";
  // The lease's TTL: how long a dead primary keeps its role. etcd rounds
  // up to whole seconds, no lower than its own minimum.
  absl::Duration lease_ttl = absl::Seconds(1);
  // How often a member looks at the coordinator without a watch on it; with
  // one (Coordinator::WatchPrefix on the group's keys, which wakes the
  // member as they change), `watched_poll`, or a quarter of the lease if
  // that is sooner. The lease is renewed each quarter of it either way.
  absl::Duration poll = absl::Milliseconds(50);
  absl::Duration watched_poll = absl::Milliseconds(250);
  // See the file comment; 0: 5 x lease_ttl.
  absl::Duration join_wait = absl::ZeroDuration();
  // Creates the group's records if it has none (ps_server --bootstrap): a
  // new group's first start. Without them no member starts
  // (server/replica/group_records.h).
  bool bootstrap = false;
  // The state the member this one replaces held as the primary of its
  // epoch (null: none). Taken back before the member's first round, it may
  // lead the group again while `insync` still carries that epoch (no one
  // was promoted since); if another member leads, it starts again empty to
  // join it.
  std::shared_ptr<const HeldState> held;
};

class ReplicaMember {
 public:
  // Starts the member's ShardServer (`server` with replicated set and
  // member = its gRPC address once listening, which must be reachable by
  // the other members and the workers) and its loop. `coordinator` is
  // borrowed and must outlive this; so must `env`'s clock, which the
  // member and its server both read.
  static absl::StatusOr<std::unique_ptr<ReplicaMember>> Start(
      ShardServerConfig server, ReplicaConfig config, Coordinator* coordinator,
      Env env = Env());
  ~ReplicaMember() { Stop(); }

  ShardServer* server() { return server_.get(); }
  Replication::Role role() { return server_->replication()->role(); }
  const std::string& member() const { return member_; }

  // Ends the member: a primary gives up its lease at once (the next member
  // is promoted without waiting it out), and the server stops. Idempotent;
  // also what the destructor does, so it must hold for a member whose Start
  // failed before its server existed.
  void Stop();
  // Tests: ends the member as SIGKILL would: the lease is left to expire
  // and no one is told (calls in flight are answered UNAVAILABLE).
  // Idempotent.
  void Kill();
  // Whether the member ended by itself (fenced), waiting up to `timeout`.
  bool Ended(absl::Duration timeout);
  // Once Ended: if it ended as a primary whose lease ran out (the
  // coordinator out of reach), its state, for the member started in its
  // place (ReplicaConfig::held); else null.
  std::shared_ptr<const HeldState> TakeHeldState();
  // The primary records that the job is done (`key` = "1"), fenced as its
  // other records are; FAILED_PRECONDITION from any other member.
  absl::Status RecordJobDone(const std::string& key);

 private:
  ReplicaMember(ReplicaConfig config, Coordinator* coordinator, Clock* clock);
  std::string Key(const std::string& name) const;
  // The loop: lease, election, following, until stopped or fenced.
  void Run();
  // One round of Run; false once the member is fenced. It renews the
  // lease, then acts on the group's primary key: follows the primary it
  // names (FollowRound), or, with none, campaigns (CampaignRound) and, if
  // elected, takes the role (Promote).
  bool Round();
  // The states of a round; each returns false once the member is fenced.
  // A backup (or a member about to become one) of `primary`.
  bool FollowRound(const CoordinatedValue& primary, absl::Time now);
  // No primary since `no_primary_since_`: waits, starts the group again, or
  // stands for election.
  bool CampaignRound(absl::Time now);
  // Every member holding the group's state is gone (Campaign::kGroupLost).
  bool StartGroupAgain();
  // Won the election as epoch `epoch`: ends the old stream, records the
  // epoch and serves.
  bool Promote(int64_t epoch);
  // Backup: joins the primary `address` of `epoch` and applies its stream
  // until it ends (on the follower thread).
  void Follow(std::string address, int64_t epoch);
  absl::Status FollowOnce(const std::string& address, int64_t epoch);
  // Applies and acknowledges the primary's ops on a joined `stream` until
  // it ends (an error: the primary went, or refused an op).
  absl::Status ApplyStream(Stream* stream);
  // Renews the lease; false if a primary's is lost (a backup's is
  // replaced: Regrant).
  bool Renew();
  // A backup's new lease in place of its old; false if none was granted.
  bool Regrant(absl::Time now);
  // Whether a member may campaign now that there is no primary.
  enum class Campaign {
    kWait,
    kNow,        // A new group, or a backup holding every change.
    kGroupLost,  // No one holding the state came back within join_wait.
  };
  Campaign MayCampaign(absl::Time now);
  // Whether `insync` of the epoch this member follows lists it (true too
  // while the coordinator cannot say).
  bool ListedInSync();
  // A backup whose stream broke (the connection, not a refusal) and which
  // `insync` lists: removes the primary key of `primary` if the primary
  // is seen to be gone (PrimaryMayLive), in one transaction that holds
  // only while the key is still that epoch's and `insync` is as read. True
  // if it did: the member campaigns at once instead of waiting out the
  // dead primary's lease.
  bool DeposeDeadPrimary(const CoordinatedValue& primary);
  // Loads `held` (ReplicaConfig::held) into the new server, before the
  // loop starts; on failure the member starts empty.
  void TakeBack(const HeldState& held);
  // False only if the primary of `epoch` at `address` is seen to be gone:
  // nothing listens there (the connection is refused), or what answers
  // there says it is not that primary (a process started in its place).
  // No answer in time (a partition) is true: the lease decides then.
  bool PrimaryMayLive(const std::string& address, int64_t epoch);
  void Fence(const std::string& why);
  // The primary's backups, written to `insync`.
  absl::Status RecordBackups(const std::vector<std::string>& backups);
  // Writes `puts` only while this member's epoch is the group's (the
  // primary key's create revision): every record a primary makes.
  absl::Status PutAsPrimary(std::vector<KeyPut> puts);
  // Replication's JoinCheck: PERMISSION_DENIED unless `joiner` is listed
  // under the group's members/ (each member puts itself there, bound to
  // its lease, as it starts).
  absl::Status CheckJoiner(const std::string& joiner);

  const ReplicaConfig config_;
  Coordinator* const coordinator_;
  Clock* const clock_;  // The Env's; the server's Replication reads it too.
  std::unique_ptr<ShardServer> server_;
  std::string member_;
  int shard_ = 0;
  std::thread loop_;
  // On the group's keys; null if the coordinator could not make one.
  std::unique_ptr<Coordinator::Watch> watch_;

  absl::Notification stop_;
  absl::Notification ended_;
  bool killed_ = false;  // Set before stop_.

  // The loop's own state (its thread only).
  int64_t lease_ = 0;
  absl::Duration ttl_;
  absl::Time lease_deadline_;
  absl::Time next_renewal_ = absl::InfinitePast();
  absl::Time no_primary_since_ = absl::InfinitePast();
  absl::Time stream_ended_at_ = absl::InfinitePast();
  int64_t following_ = 0;    // The epoch whose stream this member joined.
  int64_t held_epoch_ = 0;   // The epoch of the state taken back (held).
  bool lease_lost_ = false;  // Ended as a primary whose lease ran out.
  int64_t insync_mod_ = 0;   // `insync`'s mod revision when last read.
  absl::Time next_complaint_ = absl::InfinitePast();  // No records: logged.

  absl::Time next_probe_ = absl::InfinitePast();  // Real time.

  std::thread follower_;
  absl::Mutex mu_;
  bool stream_ended_ ABSL_GUARDED_BY(mu_) = false;
  // The stream ended with the connection (UNAVAILABLE: the primary's
  // process went, or the network), not with a refusal or an op that failed.
  bool stream_broke_ ABSL_GUARDED_BY(mu_) = false;
  // Wakes the loop before its next round is due (the stream ended, Stop,
  // the watch saw the group's keys change).
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  int follower_fd_ ABSL_GUARDED_BY(mu_) = -1;  // To break it at Stop.
};

}  // namespace asyncps

#endif  // ASYNCPS_SERVER_REPLICA_REPLICA_MEMBER_H_
