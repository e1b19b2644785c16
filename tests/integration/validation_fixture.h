// The fixture of the in-process shard tests (validation_test.cc,
// shard_answers_test.cc): shard 0 of 2 with the whole server (service,
// store, consistency) reached through gRPC's in-process transport, rank 0
// of a one-worker job registered, a model of two tensors whose slices are
// split between the shards, and helpers to push, pull and check that no
// weight moved.
#ifndef ASYNCPS_TESTS_INTEGRATION_VALIDATION_FIXTURE_H_
#define ASYNCPS_TESTS_INTEGRATION_VALIDATION_FIXTURE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>
#include <vector>

#include "common/partitioner.h"
#include "common/tensor_bytes.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "server/shard_server.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {

inline constexpr int64_t kMaxMessage = 1 << 20;

class ValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ShardServerConfig config;
    config.host = "";  // In-process only: no socket, no port.
    config.shard = 0;
    config.num_shards = 2;
    config.max_message_bytes = kMaxMessage;
    auto server = ShardServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    channel_ = server_->InProcessChannel();
    stub_ = v1::ParameterServer::NewStub(channel_);
    spec_ = ConstantSpec({{40, 30}, {7}}, 2, 0.5f, 0.1f, 256);
    auto p = Partition::Create(spec_);
    ASSERT_TRUE(p.ok());
    partition_ = *std::move(p);
    for (size_t i = 0; i < partition_.slices().size(); ++i) {
      (partition_.slices()[i].shard == 0 ? mine_ : theirs_).push_back(i);
    }
    ASSERT_GE(mine_.size(), 2u);
    ASSERT_GE(theirs_.size(), 1u);
    // The test's calls act as rank 0 of a one-worker job, registered.
    v1::RegisterRequest join;
    join.set_rank(0);
    join.set_num_workers(1);
    v1::RegisterResponse joined;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->Register(&ctx, join, &joined).ok());
    secret_ = joined.secret();
  }

  void Declare() {
    v1::DeclareModelRequest req;
    *req.mutable_spec() = spec_;
    req.set_secret(secret_);
    v1::DeclareModelResponse resp;
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->DeclareModel(&ctx, req, &resp).ok());
    ASSERT_TRUE(resp.created());
  }

  v1::SliceKey Key(int i) const {
    const SliceInfo& s = partition_.slices()[i];
    v1::SliceKey key;
    key.set_tensor(spec_.tensors(s.tensor).name());
    key.set_index(s.index);
    key.set_begin(s.begin);
    key.set_count(s.count);
    return key;
  }

  // A well-formed gradient of all `value` for slice i.
  v1::SliceData Grad(int i, float value = 1.0f) const {
    v1::SliceData d;
    *d.mutable_key() = Key(i);
    d.set_dtype(v1::DTYPE_F32);
    std::vector<float> g(partition_.slices()[i].count, value);
    EncodeF32(g, d.mutable_data());
    return d;
  }

  grpc::Status Push(const std::vector<v1::SliceData>& grads) {
    v1::PushRequest req;
    req.set_secret(secret_);
    for (const auto& g : grads) *req.add_gradients() = g;
    v1::PushResponse resp;
    grpc::ClientContext ctx;
    return stub_->Push(&ctx, req, &resp);
  }

  grpc::Status Pull(const std::vector<v1::SliceKey>& keys,
                    v1::PullResponse* resp) {
    v1::PullRequest req;
    req.set_secret(secret_);
    for (const auto& k : keys) *req.add_slices() = k;
    grpc::ClientContext ctx;
    return stub_->Pull(&ctx, req, resp);
  }

  // Every slice of shard 0 still holds its initial value at version 0.
  void ExpectUntouched() {
    std::vector<v1::SliceKey> keys;
    for (int i : mine_) keys.push_back(Key(i));
    v1::PullResponse resp;
    ASSERT_TRUE(Pull(keys, &resp).ok());
    for (const auto& d : resp.slices()) {
      EXPECT_EQ(d.version(), 0) << d.key().tensor() << "#" << d.key().index();
      std::vector<float> w(d.data().size() / 4);
      DecodeF32(d.data(), absl::MakeSpan(w));
      for (float x : w) ASSERT_EQ(x, 0.5f);
    }
  }

  void ExpectRejected(const grpc::Status& s, grpc::StatusCode code,
                      absl::string_view words) {
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(std::string(words)), std::string::npos)
        << "message '" << s.error_message() << "' lacks '" << words << "'";
    ExpectUntouched();
  }

  std::unique_ptr<ShardServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::ParameterServer::Stub> stub_;
  v1::ModelSpec spec_;
  Partition partition_;
  std::vector<int> mine_, theirs_;
  uint64_t secret_ = 0;  // Rank 0's registration.
};

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_VALIDATION_FIXTURE_H_
