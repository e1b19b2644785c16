// Replication (server/replication.h) between two members in one process,
// over a socket pair: the snapshot a joining backup starts from holds each
// push's answer with its effect, so exactly-once survives a promotion.
#include "server/replication.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <memory>
#include <thread>
#include <vector>

#include "common/status_macros.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "tests/server/small_model.h"
#include "transport/frame.h"

namespace asyncps {
namespace {

using testing::SmallModel;
using testing::SmallModelPush;

// One member: its store, ledger and Replication.
struct Member {
  explicit Member(const std::string& name)
      : store(0, 1, uint64_t{64} << 20),
        replication(&store, &ledger, Clock::Real(), name, PushPolicy(),
                    absl::Seconds(10)) {}
  ShardStore store;
  PushLedger ledger;
  Replication replication;
};

// A connected pair of non-blocking streams.
struct StreamPair {
  StreamPair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    for (int fd : fds) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    a = std::make_unique<TcpStream>(fds[0]);
    b = std::make_unique<TcpStream>(fds[1]);
  }
  ~StreamPair() {
    close(a->fd());
    close(b->fd());
  }
  std::unique_ptr<TcpStream> a, b;
};

// The backup's side of one op: read, apply, acknowledge.
absl::Status FollowOne(Stream* stream, Replication* backup) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  ASSIGN_OR_RETURN(FrameHeader header,
                   ReadHeader(stream, uint64_t{64} << 20, deadline));
  v1::ReplicaOp op;
  RETURN_IF_ERROR(ReadBody(
      stream, header, &op, [&] { return PayloadFields(&op); }, deadline));
  RETURN_IF_ERROR(backup->Apply(&op));
  v1::ReplicaAck ack;
  ack.set_seq(op.seq());
  FrameHeader answer;
  answer.op = FrameOp::kAnswer;
  return WriteFrame(stream, answer, &ack, {}, deadline);
}

std::vector<float> Weights(ShardStore* store) {
  v1::PullRequest pull;
  *pull.add_slices() = testing::SmallModelKey();
  v1::PullResponse response;
  EXPECT_TRUE(store->Pull(pull, &response).ok());
  std::vector<float> w(4);
  DecodeF32(response.slices(0).data(), absl::MakeSpan(w));
  return w;
}

// Regression (issue #38, 6): the snapshot held only the pushes whose
// answer the ledger had recorded, while a push applied under the order
// lock but not yet recorded (Consistency::Push records it after
// Replication::Push returns) was in the snapshot's weights. A backup that
// joined in that gap and was promoted applied the client's retry a second
// time. This drives exactly that gap: the push is applied by the primary,
// the backup joins before Consistency would record the answer, and a retry
// on the backup must be answered, not applied.
TEST(Replication, ABackupJoiningBeforeAnAnswerIsRecordedKnowsThePush) {
  Member primary("p"), backup("b");
  primary.replication.BecomePrimary(1, absl::InfiniteFuture());
  ASSERT_TRUE(primary.replication
                  .Declare([] {
                    v1::DeclareModelRequest r;
                    *r.mutable_spec() = SmallModel();
                    return r;
                  }())
                  .ok());

  v1::PushRequest push = SmallModelPush(3.0f);
  push.set_client_id(42);
  push.set_sequence(7);
  v1::PushResponse answer;
  ASSERT_EQ(primary.ledger.Begin(push, &answer), PushLedger::Verdict::kApply);
  ASSERT_TRUE(primary.replication.Push(push, PushPolicy(), &answer).ok());
  // Consistency::Push would record the answer now (ledger.Finish); the
  // backup joins first.

  StreamPair streams;
  v1::ReplicaJoin join;
  join.set_epoch(1);
  join.set_member("b");
  std::thread serve([&] {
    absl::Status s = primary.replication.ServeBackup(streams.a.get(), join);
    EXPECT_FALSE(s.ok());  // It ends when the primary is fenced below.
  });
  backup.replication.BecomeBackup(1, "p");
  ASSERT_TRUE(FollowOne(streams.b.get(), &backup.replication).ok());
  primary.ledger.Finish(push, absl::OkStatus(), answer);

  // The backup holds the push's effect...
  EXPECT_EQ(Weights(&backup.store), std::vector<float>(4, 7.0f));
  // ...and, promoted, answers the client's retry instead of applying it.
  v1::PushResponse retried;
  EXPECT_EQ(backup.ledger.Begin(push, &retried), PushLedger::Verdict::kAnswered)
      << "a retry of push 7 would be applied a second time";
  EXPECT_EQ(retried.versions_size(), answer.versions_size());

  primary.replication.Fence("test over");
  serve.join();
}

}  // namespace
}  // namespace asyncps
