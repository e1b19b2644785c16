// Two members of a replicated shard in one process (server/replication.h),
// for the replication tests: a member's store, ledgers, tables and
// Replication; a socket pair between a primary and a backup; and the
// backup's side of the stream (read an op, apply it, acknowledge it).
#ifndef ASYNCPS_TESTS_SERVER_REPLICATION_PAIR_H_
#define ASYNCPS_TESTS_SERVER_REPLICATION_PAIR_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "gtest/gtest.h"
#include "server/embedding_table.h"
#include "server/membership.h"
#include "server/push_ledger.h"
#include "server/replication.h"
#include "server/shard_store.h"
#include "transport/socket.h"
#include "transport/stream.h"

namespace asyncps::testing {

// One member of a one-shard job: its store, push ledger, embedding tables,
// membership and Replication (applying pushes with `policy`).
struct Member {
  explicit Member(const std::string& name, PushPolicy policy = PushPolicy());
  ShardStore store;
  PushLedger ledger;
  EmbeddingTables tables;
  Membership membership;
  Replication replication;
};

// A connected pair of non-blocking streams (a: the primary's end).
struct StreamPair {
  StreamPair();
  ~StreamPair();
  std::unique_ptr<TcpStream> a, b;
};

// `backup` asks to join `primary` (a primary of epoch 1) over `streams`:
// the primary serves it on the thread returned (it ends, not OK, once the
// primary is fenced); the backup's side of the stream is the caller's.
std::thread ServeJoin(Member* primary, Member* backup, StreamPair* streams);

// `backup` joins `primary` (a primary of epoch 1) over `streams`: the
// primary serves it on the thread returned (it ends, not OK, once the
// primary is fenced); returns once the backup holds the snapshot, or
// with a test failure if it does not.
std::thread JoinBackup(Member* primary, Member* backup, StreamPair* streams);

// Waits (10 s at most) until `primary` lists `backups` backups in sync;
// false if it does not.
bool WaitInSync(Member* primary, int backups);

// The backup's side of one op: read, apply, acknowledge (if it is due).
absl::Status FollowOne(Stream* stream, Replication* backup);
// Its parts: read an op (within 10 s); acknowledge op `seq`.
absl::Status ReadOp(Stream* stream, v1::ReplicaOp* op);
absl::Status WriteAck(Stream* stream, uint64_t seq);

// Runs `f` (a change on the primary) while `backup` follows the one op it
// streams; returns what `f` returned.
template <typename F>
absl::Status Streamed(StreamPair* streams, Member* backup, F f) {
  std::thread follow([&] {
    EXPECT_TRUE(FollowOne(streams->b.get(), &backup->replication).ok());
  });
  absl::Status s = f();
  follow.join();
  return s;
}

// The backup's side of a whole snapshot: every op until it is a backup;
// `*ops` (if given) gets how many.
absl::Status FollowSnapshot(Stream* stream, Replication* backup,
                            int* ops = nullptr);

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_SERVER_REPLICATION_PAIR_H_
