// The public client library (include/asyncps/client.h) against real
// ps_server processes: a model declared from named tensors with the
// caller's initial weights, pulls and pushes by name with the exact SGD
// arithmetic, the first declarer's weights winning, bsp averaging two
// workers, and each wrong input refused with its own status and no weight
// moved. (--compress through the same: client_compress_test.cc.)
#include "tests/integration/client_api.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "asyncps/client.h"
#include "gtest/gtest.h"
#include "tests/integration/test_cluster.h"

namespace asyncps::testing {
namespace {

TEST(ClientApi, DeclaresPullsAndPushesByName) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect(Options(**cluster, 0, 2));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<std::vector<float>> initial = {{1, 2, 3, 4, 5, 6},
                                                   {0.5f, -0.5f, 0}};
  ASSERT_TRUE((*client)->Declare(kModel, In(initial), Sgd(0.5f)).ok());
  EXPECT_EQ((*client)->tensors().size(), 2u);
  std::vector<std::vector<float>> w = {std::vector<float>(6),
                                       std::vector<float>(3)};
  ASSERT_TRUE((*client)->Pull({"layer.w", "layer.b"}, Out(&w)).ok());
  EXPECT_EQ(w, initial);

  // Another worker's declaration agrees and its own weights are not used.
  auto other = Client::Connect(Options(**cluster, 1, 2));
  ASSERT_TRUE(other.ok()) << other.status();
  const std::vector<std::vector<float>> ignored = {std::vector<float>(6, 9),
                                                   std::vector<float>(3, 9)};
  ASSERT_TRUE((*other)->Declare(kModel, In(ignored), Sgd(0.5f)).ok());
  std::vector<std::vector<float>> seen = {std::vector<float>(3)};
  ASSERT_TRUE((*other)->Pull({"layer.b"}, Out(&seen)).ok());
  EXPECT_EQ(seen[0], initial[1]);

  // w -= 0.5 * g, exactly (the values are exact in f32).
  const std::vector<std::vector<float>> g = {{2, 2, 2, -2, -2, -2}};
  ASSERT_TRUE((*client)->Push({"layer.w"}, In(g)).ok());
  (*client)->EndStep();
  EXPECT_EQ((*client)->clock(), 1);
  ASSERT_TRUE((*client)->Pull({"layer.w", "layer.b"}, Out(&w)).ok());
  EXPECT_EQ(w[0], (std::vector<float>{0, 1, 2, 5, 6, 7}));
  EXPECT_EQ(w[1], initial[1]);
  // The fused call: push, then the weights after it, in one round trip.
  const std::vector<std::vector<float>> gb = {{1, 1, 1}};
  std::vector<std::vector<float>> b = {std::vector<float>(3)};
  ASSERT_TRUE((*client)->PushPull({"layer.b"}, In(gb), Out(&b)).ok());
  EXPECT_EQ(b[0], (std::vector<float>{0, -1, -0.5f}));
  EXPECT_EQ((*client)->clock(), 2);
}

TEST(ClientApi, EachTensorTravelsInItsOwnWireDtype) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect(Options(**cluster, 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  // 1 + 2^-10 is exact in f32 and f16, and rounds to 1 in bf16.
  const float odd = 1.0f + 1.0f / 1024;
  const std::vector<std::vector<float>> initial = {std::vector<float>(6, odd),
                                                   std::vector<float>(3, odd)};
  std::vector<TensorSpec> model = kModel;
  model[1].wire_dtype = "nope";
  absl::Status bad = (*client)->Declare(model, In(initial), Sgd(0.5f));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("layer.b"), std::string::npos) << bad;
  model[1].wire_dtype = "bf16";
  ASSERT_TRUE((*client)->Declare(model, In(initial), Sgd(0.5f)).ok());
  EXPECT_EQ((*client)->tensors()[0].wire_dtype, "f32");
  EXPECT_EQ((*client)->tensors()[1].wire_dtype, "bf16");
  std::vector<std::vector<float>> w = {std::vector<float>(6),
                                       std::vector<float>(3)};
  ASSERT_TRUE((*client)->Pull({"layer.w", "layer.b"}, Out(&w)).ok());
  EXPECT_EQ(w[0], initial[0]);                   // f32: exact.
  EXPECT_EQ(w[1], std::vector<float>(3, 1.0f));  // bf16: rounded.
  // Gradients go in bf16 too (0.5 is exact there); the servers keep f32
  // masters, as a reader on f32 sees.
  const std::vector<std::vector<float>> g = {std::vector<float>(6, 0.5f),
                                             std::vector<float>(3, 0.5f)};
  ASSERT_TRUE((*client)->PushPull({"layer.w", "layer.b"}, In(g), Out(&w)).ok());
  EXPECT_EQ(w[0], std::vector<float>(6, odd - 0.25f));
  EXPECT_EQ(w[1], std::vector<float>(3, 0.75f));  // bf16 of odd - 0.25.
  ClientOptions o = Options(**cluster, -1, 1);
  o.worker = false;
  auto reader = Client::Connect(o);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_TRUE((*reader)->Attach().ok());
  std::vector<std::vector<float>> master = {std::vector<float>(3)};
  ASSERT_TRUE((*reader)->Pull({"layer.b"}, Out(&master)).ok());
  EXPECT_EQ(master[0], std::vector<float>(3, odd - 0.25f));
}

TEST(ClientApi, ResolvedTensorSetsSkipTheNamesAndBelongToTheirModel) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect(Options(**cluster, 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  EXPECT_EQ((*client)->Resolve({"layer.w"}).status().code(),
            absl::StatusCode::kFailedPrecondition);  // No model yet.
  const std::vector<std::vector<float>> initial = {{1, 2, 3, 4, 5, 6},
                                                   {0.5f, -0.5f, 0}};
  ASSERT_TRUE((*client)->Declare(kModel, In(initial), Sgd(0.5f)).ok());
  EXPECT_EQ((*client)->Resolve({"nope"}).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ((*client)->Resolve({"layer.b", "layer.b"}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto set = (*client)->Resolve({"layer.b", "layer.w"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->names(), (std::vector<std::string>{"layer.b", "layer.w"}));
  std::vector<std::vector<float>> w = {std::vector<float>(3),
                                       std::vector<float>(6)};
  ASSERT_TRUE((*client)->Pull(*set, Out(&w), CallOptions()).ok());
  EXPECT_EQ(w[0], initial[1]);
  EXPECT_EQ(w[1], initial[0]);
  const std::vector<std::vector<float>> g = {{2, 2, 2},
                                             std::vector<float>(6, 0)};
  ASSERT_TRUE((*client)->PushPull(*set, In(g), Out(&w), CallOptions()).ok());
  EXPECT_EQ(w[0], (std::vector<float>{-0.5f, -1.5f, -1}));
  // Wrong buffer counts, an empty set, and a set of an earlier adoption
  // are refused.
  EXPECT_EQ((*client)->Pull(*set, {}, CallOptions()).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*client)->Pull(TensorSet(), {}, CallOptions()).code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE((*client)->Attach().ok());
  EXPECT_EQ((*client)->Pull(*set, Out(&w), CallOptions()).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ClientApi, WrongInputIsRefusedAndChangesNoWeight) {
  auto cluster = TestCluster::Start(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect(Options(**cluster, 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  std::vector<std::vector<float>> w = {std::vector<float>(6),
                                       std::vector<float>(3)};
  EXPECT_EQ((*client)->Pull({"layer.w"}, {Out(&w)[0]}).code(),
            absl::StatusCode::kFailedPrecondition);  // No model yet.
  const std::vector<std::vector<float>> initial = {std::vector<float>(6, 1),
                                                   std::vector<float>(3, 1)};
  EXPECT_EQ((*client)->Declare(kModel, {In(initial)[0]}, Sgd(0.5f)).code(),
            absl::StatusCode::kInvalidArgument);  // One buffer for two.
  ASSERT_TRUE((*client)->Declare(kModel, In(initial), Sgd(0.5f)).ok());

  absl::Status s = (*client)->Pull({"nope"}, {Out(&w)[0]});
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("'nope'"), std::string::npos) << s;
  std::vector<float> short_buffer(5);
  s = (*client)->Push({"layer.w"}, {absl::MakeConstSpan(short_buffer)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("'layer.w' has 6 elements but its buffer 5"),
            std::string::npos)
      << s;
  std::vector<float> nan(6, 1.0f);
  nan[4] = std::numeric_limits<float>::quiet_NaN();
  s = (*client)->Push({"layer.w"}, {absl::MakeConstSpan(nan)});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("NaN"), std::string::npos) << s;
  s = (*client)->Push({"layer.w", "layer.w"}, {nan, nan});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  // A declaration that disagrees (another shape) is refused too.
  std::vector<TensorSpec> other = kModel;
  other[1].shape = {4};
  const std::vector<std::vector<float>> other_initial = {std::vector<float>(6),
                                                         std::vector<float>(4)};
  s = (*client)->Declare(other, In(other_initial), Sgd(0.5f));
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;

  ASSERT_TRUE((*client)->Pull({"layer.w", "layer.b"}, Out(&w)).ok());
  EXPECT_EQ(w, initial) << "a refused call moved a weight";
}

// The client's NaN/Inf check reads 8 elements at a time, then the tail:
// a non-finite value anywhere is found and named; the largest finite
// values, subnormals and -0 pass.
TEST(ClientApi, EveryNonFiniteElementIsFoundWhereverItIs) {
  auto cluster = TestCluster::Start(1);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto client = Client::Connect(Options(**cluster, 0, 1));
  ASSERT_TRUE(client.ok()) << client.status();
  const std::vector<float> zeros(37, 0.0f);
  ASSERT_TRUE((*client)->Declare({{"v", {37}}}, {zeros}, Sgd(0.0f)).ok());
  const float bad[] = {std::numeric_limits<float>::quiet_NaN(),
                       std::numeric_limits<float>::infinity(),
                       -std::numeric_limits<float>::infinity()};
  for (int at : {0, 7, 8, 31, 32, 36}) {
    for (float x : bad) {
      std::vector<float> g(37, 1.0f);
      g[at] = x;
      const absl::Status s = (*client)->Push({"v"}, {g});
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << at;
      EXPECT_NE(s.message().find(absl::StrCat("at element ", at, ";")),
                std::string::npos)
          << s;
    }
  }
  std::vector<float> edge(37, -0.0f);
  edge[3] = std::numeric_limits<float>::max();
  edge[9] = -std::numeric_limits<float>::max();
  edge[20] = std::numeric_limits<float>::denorm_min();
  edge[36] = std::numeric_limits<float>::min();
  EXPECT_TRUE((*client)->Push({"v"}, {edge}).ok());
}

TEST(ClientApi, BadOptionsAndAnotherModeAreRefusedAtConnect) {
  auto cluster = TestCluster::Start(1, {"--mode=bsp"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  ClientOptions o = Options(**cluster, 0, 1, "async");
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Connect(o);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("--mode=bsp"), std::string::npos)
      << c.status();
  o.mode = "bsp";
  o.wire_dtype = "f64";
  EXPECT_EQ(Client::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.wire_dtype = "bf16";
  o.rank = 3;
  EXPECT_EQ(Client::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.servers = {"nowhere"};
  EXPECT_EQ(Client::Connect(o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(ClientApi, BspAveragesTheWorkersOfAStep) {
  auto cluster = TestCluster::Start(2, {"--mode=bsp"});
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  std::vector<std::unique_ptr<Client>> workers;
  for (int r = 0; r < 2; ++r) {
    auto c = Client::Connect(Options(**cluster, r, 2, "bsp"));
    ASSERT_TRUE(c.ok()) << c.status();
    workers.push_back(*std::move(c));
  }
  const std::vector<std::vector<float>> initial = {std::vector<float>(6, 1),
                                                   std::vector<float>(3, 1)};
  for (auto& w : workers) {
    ASSERT_TRUE(w->Declare(kModel, In(initial), Sgd(1.0f)).ok());
  }
  // Rank 0 pushes 1s, rank 1 pushes 3s: the step applies their mean, 2.
  for (int r = 0; r < 2; ++r) {
    const std::vector<std::vector<float>> g = {
        std::vector<float>(6, 1.0f + 2 * r),
        std::vector<float>(3, 1.0f + 2 * r)};
    ASSERT_TRUE(workers[r]->Push({"layer.w", "layer.b"}, In(g)).ok());
    workers[r]->EndStep();
  }
  std::vector<std::vector<float>> w = {std::vector<float>(6),
                                       std::vector<float>(3)};
  ASSERT_TRUE(workers[0]->Pull({"layer.w", "layer.b"}, Out(&w)).ok());
  EXPECT_EQ(w[0], std::vector<float>(6, -1.0f));
  EXPECT_EQ(w[1], std::vector<float>(3, -1.0f));
}

// After Client::Recover filled `w` (kModel's weights, -2 everywhere before
// the push that found shard 1 empty): the shards hold `w`, where shard 1's
// slices came back from the worker's copy (-2) and shard 0's took that push
// (-3), and the next `push` of ones moves every weight on from there.
void ExpectRecoveredFromTheCopy(Client& client,
                                const std::vector<std::vector<float>>& w,
                                const CallOptions& push) {
  const std::vector<std::string> all = {"layer.w", "layer.b"};
  const std::vector<std::vector<float>> ones = {std::vector<float>(6, 1),
                                                std::vector<float>(3, 1)};
  std::vector<std::vector<float>> check = {std::vector<float>(6),
                                           std::vector<float>(3)};
  ASSERT_TRUE(client.Pull(all, Out(&check)).ok());
  EXPECT_EQ(check, w) << "Recover pulled what the shards hold";
  int restored = 0;
  for (const auto& t : w) {
    for (float v : t) {
      EXPECT_TRUE(v == -2.0f || v == -3.0f) << v;
      restored += v == -2.0f;
    }
  }
  EXPECT_GT(restored, 0) << "shard 1's slices came back from the copy";
  ASSERT_TRUE(client.Push(all, In(ones), push).ok());
  ASSERT_TRUE(client.Pull(all, Out(&check)).ok());
  for (size_t t = 0; t < w.size(); ++t) {
    for (size_t i = 0; i < w[t].size(); ++i) {
      EXPECT_EQ(check[t][i], w[t][i] - 1.0f) << t << "," << i;
    }
  }
}

// The explicit form ps_worker trains through: each call names its step
// and the snapshot its gradient came from; the servers' staleness counts
// come back; the clock moves only when told; and a shard that restarted
// without a checkpoint gets the model and this worker's weights back.
TEST(ClientApi, ExplicitCallsMeasureStalenessAndRecoverALostShard) {
  auto cluster = TestCluster::Start(2);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  auto connected = Client::Connect(Options(**cluster, 0, 1));
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client& client = **connected;
  const std::vector<std::vector<float>> ones = {std::vector<float>(6, 1),
                                                std::vector<float>(3, 1)};
  ASSERT_TRUE(client.Declare(kModel, In(ones), Sgd(1.0f)).ok());
  const std::vector<std::string> all = {"layer.w", "layer.b"};
  std::vector<std::vector<float>> w = {std::vector<float>(6),
                                       std::vector<float>(3)};
  Snapshot first;
  EXPECT_EQ(first.min_version(), -1);
  CallOptions pull;
  pull.step = 0;
  pull.into = &first;
  ASSERT_TRUE(client.Pull(all, Out(&w), pull).ok());
  EXPECT_EQ(first.min_version(), 0);

  // Two pushes computed from the same weights: the second is one update
  // stale on every slice.
  PushStats fresh, stale;
  CallOptions push;
  push.step = 1;
  push.from = &first;
  push.stats = &fresh;
  ASSERT_TRUE(client.Push(all, In(ones), push).ok());
  EXPECT_GT(fresh.slices, 2);  // 16-byte slices: 3 of w, 1 of b at least.
  EXPECT_EQ(fresh.total_staleness, 0);
  push.stats = &stale;
  ASSERT_TRUE(client.Push(all, In(ones), push).ok());
  EXPECT_EQ(stale.slices, fresh.slices);
  EXPECT_EQ(stale.total_staleness, stale.slices);
  EXPECT_EQ(stale.max_staleness, 1);
  EXPECT_EQ(client.clock(), 0) << "explicit calls do not move the clock";

  // PushPull from and into one snapshot: 1 - 3 * 1.
  Snapshot now = first;
  CallOptions both;
  both.step = 2;
  both.from = &now;
  both.into = &now;
  PushStats third;
  both.stats = &third;
  ASSERT_TRUE(client.PushPull(all, In(ones), Out(&w), both).ok());
  EXPECT_EQ(w[0], std::vector<float>(6, -2.0f));
  EXPECT_EQ(third.total_staleness, 2 * third.slices) << "from `first`";
  EXPECT_EQ(now.min_version(), 3);
  EXPECT_EQ(first.min_version(), 0) << "a copy is its own";
  client.SetClock(5);
  EXPECT_EQ(client.clock(), 5);

  // Shard 1 comes back empty: calls fail FAILED_PRECONDITION (shard 0
  // applies its part of this push) until the worker recovers it from its
  // copy (-2 everywhere).
  ASSERT_TRUE((*cluster)->Restart(1, {}).ok());
  push.from = &now;
  push.stats = nullptr;
  const absl::Status lost = client.Push(all, In(ones), push);
  ASSERT_EQ(lost.code(), absl::StatusCode::kFailedPrecondition) << lost;
  EXPECT_EQ(client.Recover(absl::InternalError("other"), Out(&w), &now).code(),
            absl::StatusCode::kInternal)
      << "any other failure is returned as it is";
  ASSERT_TRUE(client.Recover(lost, Out(&w), &now).ok());
  ExpectRecoveredFromTheCopy(client, w, push);
}

}  // namespace
}  // namespace asyncps::testing
