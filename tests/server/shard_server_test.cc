// ShardServer in-process: its config is checked before anything starts, it
// serves through an in-process channel, and a shard stopped and started
// again over the same (in-memory) file system resumes from its last
// checkpoint.
#include "server/shard_server.h"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/status.h"
#include "common/tensor_bytes.h"
#include "common/testing/fault_file_system.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "proto/health.grpc.pb.h"
#include "tests/server/small_model.h"

namespace asyncps {
namespace {

using ::asyncps::testing::FaultFileSystem;

TEST(ShardServerConfig, BadValuesAreRefusedNamingTheFlag) {
  struct Case {
    std::function<void(ShardServerConfig*)> set;
    std::string words;
  };
  const std::vector<Case> cases = {
      {[](ShardServerConfig* c) { c->shard = c->num_shards = 2; }, "--shard=2"},
      {[](ShardServerConfig* c) { c->port = 70000; }, "--port=70000"},
      {[](ShardServerConfig* c) { c->max_message_bytes = 10; },
       "--max_message_bytes=10"},
      {[](ShardServerConfig* c) { c->max_shard_bytes = 0; },
       "--max_shard_bytes"},
      {[](ShardServerConfig* c) { c->join_backlog_bytes = 0; }, "--join_backl"},
      {[](ShardServerConfig* c) { c->worker_timeout = absl::ZeroDuration(); },
       "--worker_timeout"},
      {[](ShardServerConfig* c) {
         c->checkpoint_dir = "/x";
         c->checkpoint_keep = 0;
       },
       "--checkpoint_keep"},
      {[](ShardServerConfig* c) { c->consistency.backup_workers = -1; },
       "--backup_workers"},
  };
  for (const Case& c : cases) {
    ShardServerConfig config;
    c.set(&config);
    absl::Status s = config.Validate();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.words;
    EXPECT_NE(s.message().find(c.words), absl::string_view::npos)
        << c.words << ": " << s;
    auto server = ShardServer::Start(config);
    EXPECT_FALSE(server.ok()) << c.words;  // Nothing is started.
  }
}

class ShardServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    config_.host = "";  // In-process only.
    config_.checkpoint_dir = "/ckpt";
    config_.checkpoint_every = absl::ZeroDuration();
    spec_ = testing::SmallModel();
  }

  std::unique_ptr<ShardServer> Start() {
    Env env;
    env.fs = &fs_;
    auto server = ShardServer::Start(config_, env);
    EXPECT_TRUE(server.ok()) << server.status();
    return server.ok() ? *std::move(server) : nullptr;
  }

  // Registers `rank` of `num_workers` through `stub` (carrying
  // `authorization` if not empty) and returns the registration's secret,
  // which the rank's calls must carry.
  static uint64_t Join(v1::ParameterServer::Stub* stub, int rank,
                       int num_workers = 1,
                       const std::string& authorization = "") {
    v1::RegisterRequest join;
    join.set_rank(rank);
    join.set_num_workers(num_workers);
    v1::RegisterResponse joined;
    grpc::ClientContext ctx;
    if (!authorization.empty()) ctx.AddMetadata("authorization", authorization);
    grpc::Status s = stub->Register(&ctx, join, &joined);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return joined.secret();
  }

  // A declare of the test's model by rank 0 holding `secret`.
  v1::DeclareModelRequest Declare(uint64_t secret) const {
    v1::DeclareModelRequest declare;
    *declare.mutable_spec() = spec_;
    declare.set_rank(0);
    declare.set_secret(secret);
    return declare;
  }

  // The weight of element 0 and the slice's version, read through gRPC.
  static std::pair<float, int64_t> Read(v1::ParameterServer::Stub* stub) {
    v1::PullRequest req;
    *req.add_slices() = testing::SmallModelKey();
    req.set_rank(-1);
    v1::PullResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s = stub->Pull(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    if (!s.ok()) return {0, -1};
    std::vector<float> w(4);
    DecodeF32(resp.slices(0).data(), absl::MakeSpan(w));
    return {w[0], resp.slices(0).version()};
  }

  ShardServerConfig config_;
  v1::ModelSpec spec_;
  FaultFileSystem fs_;
};

TEST_F(ShardServerTest, RestartResumesFromTheFinalCheckpoint) {
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    EXPECT_EQ(server->port(), 0);
    auto stub = v1::ParameterServer::NewStub(server->InProcessChannel());
    const uint64_t secret = Join(stub.get(), 0);
    v1::DeclareModelResponse declared;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->DeclareModel(&ctx, Declare(secret), &declared).ok());
    v1::PushResponse pushed;
    grpc::ClientContext push_ctx;
    v1::PushRequest push = testing::SmallModelPush(2.5f);
    push.set_secret(secret);
    ASSERT_TRUE(stub->Push(&push_ctx, push, &pushed).ok());
    EXPECT_EQ(Read(stub.get()), std::make_pair(7.5f, int64_t{1}));
    server->Shutdown();  // Writes the final checkpoint.
  }
  ASSERT_EQ(fs_.Paths().size(), 1u);
  auto server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->store().declared());
  auto stub = v1::ParameterServer::NewStub(server->InProcessChannel());
  EXPECT_EQ(Read(stub.get()), std::make_pair(7.5f, int64_t{1}));
}

// No checkpoint until the initial weights come (history checker, seed 1).
TEST_F(ShardServerTest, NoCheckpointWhileTheInitialWeightsAreAwaited) {
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    auto stub = v1::ParameterServer::NewStub(server->InProcessChannel());
    const uint64_t secret = Join(stub.get(), 0);
    v1::DeclareModelRequest declare = Declare(secret);
    declare.set_weights_follow(true);
    v1::DeclareModelResponse declared;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub->DeclareModel(&ctx, declare, &declared).ok());
  }  // Shut down: no final checkpoint.
  EXPECT_TRUE(fs_.Paths().empty());
  auto server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_FALSE(server->store().declared());
}

// Stats (and so /metrics and psctl status) say how many checkpoints were
// written and failed, and the last one's age and size.
TEST_F(ShardServerTest, CheckpointsShowInStats) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto stub = v1::ParameterServer::NewStub(server->InProcessChannel());
  auto stats = [&stub] {
    v1::StatsResponse r;
    grpc::ClientContext ctx;
    EXPECT_TRUE(stub->Stats(&ctx, v1::StatsRequest(), &r).ok());
    return r;
  };
  auto checkpoint = [&stub] {
    v1::CheckpointResponse r;
    grpc::ClientContext ctx;
    return stub->Checkpoint(&ctx, v1::CheckpointRequest(), &r);
  };
  EXPECT_EQ(stats().checkpoints_written(), 0);
  EXPECT_EQ(stats().checkpoint_age_seconds(), -1);
  EXPECT_EQ(stats().last_checkpoint_timestamp_seconds(), 0);
  const double before = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  EXPECT_LE(stats().start_timestamp_seconds(), before);
  EXPECT_GT(stats().start_timestamp_seconds(), before - 60);
  v1::DeclareModelResponse declared;
  grpc::ClientContext ctx;
  ASSERT_TRUE(
      stub->DeclareModel(&ctx, Declare(Join(stub.get(), 0)), &declared).ok());

  ASSERT_TRUE(checkpoint().ok());
  v1::StatsResponse r = stats();
  EXPECT_EQ(r.checkpoints_written(), 1);
  EXPECT_EQ(r.checkpoints_failed(), 0);
  EXPECT_GE(r.checkpoint_age_seconds(), 0);
  EXPECT_GE(r.last_checkpoint_timestamp_seconds(), before);
  EXPECT_LE(r.last_checkpoint_timestamp_seconds(),
            absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  EXPECT_GT(r.checkpoint_bytes(), 16);  // 4 floats of weights, and more.

  fs_.SetFailRename(true);
  EXPECT_FALSE(checkpoint().ok());
  r = stats();
  EXPECT_EQ(r.checkpoints_written(), 1);
  EXPECT_EQ(r.checkpoints_failed(), 1);
  fs_.SetFailRename(false);
}

// Regression: a call whose deadline had passed when its handler began was
// answered DEADLINE_EXCEEDED and then the handler asked gRPC for the
// context's default reactor a second time, which aborts the server.
TEST_F(ShardServerTest, ACallPastItsDeadlineIsRefusedAndTheServerLives) {
  ManualClock late(absl::Now() + absl::Hours(1));
  Env env;
  env.fs = &fs_;
  env.clock = &late;
  auto server = ShardServer::Start(config_, env);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::ParameterServer::NewStub((*server)->InProcessChannel());
  for (int i = 0; i < 2; ++i) {
    v1::StatsResponse r;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::seconds(60));
    grpc::Status s = stub->Stats(&ctx, v1::StatsRequest(), &r);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED)
        << s.error_message();
  }
}

// With a token, a call without it, or with another, is UNAUTHENTICATED
// before anything is read: no weight moves, and the message names neither
// token.
TEST_F(ShardServerTest, CallsWithoutTheTokenAreRefused) {
  const std::string token = "job-token-0123456789abcdef";
  config_.security.token = token;
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto stub = v1::ParameterServer::NewStub(server->InProcessChannel());
  auto call = [&](const std::string& header, auto method, const auto& request,
                  auto* response) {
    grpc::ClientContext ctx;
    if (!header.empty()) ctx.AddMetadata("authorization", header);
    return (stub.get()->*method)(&ctx, request, response);
  };
  v1::DeclareModelResponse declared;
  const std::string good = "Bearer " + token;
  const uint64_t secret = Join(stub.get(), 0, 1, good);
  ASSERT_TRUE(call(good, &v1::ParameterServer::Stub::DeclareModel,
                   Declare(secret), &declared)
                  .ok());
  v1::PushRequest push = testing::SmallModelPush(2.5f);
  push.set_secret(secret);  // Rank 0's own: only the token is missing.
  for (const std::string& header :
       {std::string(), std::string("Bearer wrong-token-0123456789ab"),
        std::string("Bearer " + token + "x"), token}) {
    v1::PushResponse pushed;
    grpc::Status s =
        call(header, &v1::ParameterServer::Stub::Push, push, &pushed);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED) << header;
    EXPECT_EQ(s.error_message().find(token), std::string::npos);
    EXPECT_EQ(s.error_message().find("wrong-token"), std::string::npos);
  }
  v1::PullRequest pull;
  *pull.add_slices() = testing::SmallModelKey();
  pull.set_rank(-1);
  v1::PullResponse pulled;
  EXPECT_EQ(
      call("", &v1::ParameterServer::Stub::Pull, pull, &pulled).error_code(),
      grpc::StatusCode::UNAUTHENTICATED);
  ASSERT_TRUE(call(good, &v1::ParameterServer::Stub::Pull, pull, &pulled).ok());
  EXPECT_EQ(pulled.slices(0).version(), 0);  // No push was applied.
}

TEST_F(ShardServerTest, DamagedNewestCheckpointFallsBackToTheOneBefore) {
  {
    auto server = Start();
    ASSERT_NE(server, nullptr);
    ASSERT_TRUE(server->store().Declare(spec_).ok());
  }  // The destructor shuts down and checkpoints too.
  const std::vector<std::string> paths = fs_.Paths();
  ASSERT_EQ(paths.size(), 1u);
  // A newer, truncated file, as a crash mid-write without the rename
  // protocol would leave.
  fs_.WriteFileForTest(CheckpointPath("/ckpt", 0, int64_t{1} << 62),
                       "ASYNCPSC");
  auto server = Start();
  ASSERT_NE(server, nullptr);
  EXPECT_TRUE(server->store().declared());
}

TEST_F(ShardServerTest, CheckpointOfAnotherModelShapeStopsTheStart) {
  v1::ShardCheckpoint bad;
  *bad.mutable_spec() = spec_;
  bad.set_shard(0);  // No slices: it does not fit the model.
  ASSERT_TRUE(
      WriteCheckpointFile(&fs_, CheckpointPath("/ckpt", 0, 1), bad).ok());
  Env env;
  env.fs = &fs_;
  auto server = ShardServer::Start(config_, env);
  ASSERT_FALSE(server.ok());
  EXPECT_EQ(server.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(server.status().message().find("/ckpt"), absl::string_view::npos)
      << server.status();
}

// The standard health service says SERVING once the shard serves, and
// NOT_SERVING from the moment it drains (SIGTERM): it then refuses pushes
// (to be retried elsewhere) but still answers, until it stops.
TEST_F(ShardServerTest, HealthFollowsTheShardsLife) {
  auto server = Start();
  ASSERT_NE(server, nullptr);
  auto channel = server->InProcessChannel();
  auto health = grpc::health::v1::Health::NewStub(channel);
  auto check = [&health] {
    grpc::health::v1::HealthCheckResponse resp;
    grpc::ClientContext ctx;
    grpc::Status s =
        health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.status();
  };
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::SERVING);
  auto stub = v1::ParameterServer::NewStub(channel);
  ASSERT_TRUE(server->store().Declare(spec_).ok());
  v1::PushRequest push = testing::SmallModelPush(1.0f);
  push.set_secret(Join(stub.get(), 0));  // Refused for the drain alone.
  server->Drain();
  EXPECT_EQ(check(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  v1::PushResponse pushed;
  grpc::ClientContext push_ctx;
  grpc::Status refused = stub->Push(&push_ctx, push, &pushed);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(refused.error_message().find("registered"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(Read(stub.get()), std::make_pair(10.0f, int64_t{0}));
  EXPECT_EQ(fs_.Paths().size(), 1u);  // The last checkpoint, written.
  server->Shutdown();
}

// A file system whose checkpoint writes stall in Sync until released, as a
// slow or hung disk would.
class StallingFileSystem : public FileSystem {
 public:
  explicit StallingFileSystem(FileSystem* base) : base_(base) {}
  ~StallingFileSystem() override { Release(); }

  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  absl::Notification& stalled() { return stalled_; }

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) override {
    ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file,
                     base_->NewWritableFile(path));
    if (path.find(".ckpt") == std::string::npos) return file;
    return std::unique_ptr<WritableFile>(new Stalling(std::move(file), this));
  }
  absl::StatusOr<std::string> ReadFile(const std::string& path) override {
    return base_->ReadFile(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  absl::Status Delete(const std::string& path) override {
    return base_->Delete(path);
  }
  absl::StatusOr<std::vector<std::string>> ListDir(
      const std::string& dir) override {
    return base_->ListDir(dir);
  }
  absl::Status SyncDir(const std::string& dir) override {
    return base_->SyncDir(dir);
  }

 private:
  class Stalling : public WritableFile {
   public:
    Stalling(std::unique_ptr<WritableFile> file, StallingFileSystem* fs)
        : file_(std::move(file)), fs_(fs) {}
    absl::Status Append(absl::string_view data) override {
      return file_->Append(data);
    }
    absl::Status Sync() override {
      if (!fs_->stalled_.HasBeenNotified()) fs_->stalled_.Notify();
      fs_->release_.WaitForNotification();
      return file_->Sync();
    }
    absl::Status Close() override { return file_->Close(); }

   private:
    std::unique_ptr<WritableFile> file_;
    StallingFileSystem* fs_;
  };

  FileSystem* const base_;
  absl::Notification stalled_, release_;
};

// A periodic checkpoint stuck on the disk holds up nothing else: a bsp step
// whose straggler never comes is still applied at --step_deadline, and the
// pull waiting for it answered.
TEST_F(ShardServerTest, AStalledCheckpointDelaysNoStep) {
  StallingFileSystem stalling(&fs_);
  config_.checkpoint_every = absl::Milliseconds(1);
  config_.consistency.mode = Mode::kBsp;
  config_.consistency.step_deadline = absl::Milliseconds(50);
  Env env;
  env.fs = &stalling;
  auto server = ShardServer::Start(config_, env);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::ParameterServer::NewStub((*server)->InProcessChannel());
  const uint64_t secret = Join(stub.get(), 0, 2);
  Join(stub.get(), 1, 2);
  v1::DeclareModelResponse declared;
  grpc::ClientContext declare_ctx;
  ASSERT_TRUE(
      stub->DeclareModel(&declare_ctx, Declare(secret), &declared).ok());
  stalling.stalled().WaitForNotification();  // A checkpoint is stuck now.
  // Rank 0 pushes step 1; rank 1 never does.
  v1::PushResponse pushed;
  grpc::ClientContext push_ctx;
  v1::PushRequest push = testing::SmallModelPush(2.0f, 0, 0, 1);
  push.set_secret(secret);
  ASSERT_TRUE(stub->Push(&push_ctx, push, &pushed).ok());
  v1::PullRequest pull;
  *pull.add_slices() = testing::SmallModelKey();
  pull.set_rank(0);
  pull.set_secret(secret);
  pull.set_clock(1);
  v1::PullResponse pulled;
  grpc::ClientContext pull_ctx;
  pull_ctx.set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(30));
  grpc::Status s = stub->Pull(&pull_ctx, pull, &pulled);
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(pulled.slices(0).version(), 1);
  stalling.Release();
}

}  // namespace
}  // namespace asyncps
