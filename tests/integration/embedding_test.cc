// Sparse embedding tables through two real shards over gRPC
// (client/embedding_client.h, server/edge/service_rows.cc): rows and updates
// are exactly a single local table's fed the same calls (ids routed to their
// shards and back in the caller's order, repeated ids summed), for SGD and
// AdaGrad; bad requests, strangers and mis-routed ids are refused with
// nothing changed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <vector>

#include "client/admin_client.h"
#include "client/embedding_client.h"
#include "client/ps_client.h"
#include "client/shard_caller.h"
#include "common/partitioner.h"
#include "gtest/gtest.h"
#include "proto/asyncps.grpc.pb.h"
#include "server/edge/metrics.h"
#include "server/embedding_table.h"
#include "tests/integration/local_shards.h"

namespace asyncps::testing {
namespace {

v1::EmbeddingSpec Spec(const std::string& name, v1::OptimizerSpec::Kind kind,
                       int64_t num_rows) {
  v1::EmbeddingSpec s;
  s.set_name(name);
  s.set_dim(8);
  s.set_num_rows(num_rows);
  s.set_seed(11);
  s.mutable_init()->set_kind(v1::Initializer::NORMAL);
  s.mutable_init()->set_stddev(0.1f);
  s.mutable_optimizer()->set_kind(kind);
  s.mutable_optimizer()->set_learning_rate(0.05f);
  s.mutable_optimizer()->set_epsilon(1e-6f);
  s.mutable_optimizer()->set_initial_accumulator_value(0.1f);
  return s;
}

class EmbeddingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto shards = StartLocalShards(2);
    ASSERT_TRUE(shards.ok()) << shards.status();
    shards_ = *std::move(shards);
    worker_ = Client(/*rank=*/0);
    rows_ = std::make_unique<EmbeddingClient>(worker_->caller());
  }

  // A client of the shards; joined as `rank` unless it is -1 (a reader).
  std::unique_ptr<PsClient> Client(int rank,
                                   Transport transport = Transport::kTcp) {
    PsClientOptions options;
    options.servers = shards_.addresses;
    options.transport = transport;
    options.retry_for = absl::Seconds(5);
    auto client = PsClient::Create(options);
    EXPECT_TRUE(client.ok());
    if (rank >= 0) {
      EXPECT_TRUE((*client)->Join(rank, 2).ok());
    }
    return *std::move(client);
  }

  std::vector<float> Pull(EmbeddingClient* c, const std::string& table,
                          const std::vector<int64_t>& ids) {
    std::vector<float> out(ids.size() * 8);
    absl::Status s = c->PullRows(table, ids, absl::MakeSpan(out));
    EXPECT_TRUE(s.ok()) << s;
    return out;
  }

  LocalShards shards_;
  std::unique_ptr<PsClient> worker_;
  std::unique_ptr<EmbeddingClient> rows_;
};

// The same calls on the shards and on one local table give the same rows,
// over the data plane (rows_) and over gRPC (a second worker's client).
TEST_F(EmbeddingTest, RowsAreExactlyALocalTablesForSgdAndAdagrad) {
  int64_t clicks_rows = 0;  // Held by the reference: the ids pushed.
  auto grpc_worker = Client(/*rank=*/1, Transport::kGrpc);
  EmbeddingClient over_grpc(grpc_worker->caller());
  for (auto [name, kind, num_rows, client] :
       {std::tuple{"clicks", v1::OptimizerSpec::SGD, int64_t{0}, rows_.get()},
        std::tuple{"items", v1::OptimizerSpec::ADAGRAD, int64_t{5000},
                   rows_.get()},
        std::tuple{"grpc_items", v1::OptimizerSpec::ADAGRAD, int64_t{5000},
                   &over_grpc}}) {
    EmbeddingClient* const rows = client;
    const v1::EmbeddingSpec spec = Spec(name, kind, num_rows);
    ASSERT_TRUE(rows->Declare(spec).ok());
    ASSERT_TRUE(rows->Declare(spec).ok()) << "declaring is idempotent";
    EmbeddingTable reference(spec);
    std::mt19937_64 random(5);
    std::uniform_int_distribution<int64_t> id(0, 200);  // Many repeats.
    std::normal_distribution<float> grad(0, 1);
    for (int round = 0; round < 5; ++round) {
      std::vector<int64_t> ids(64);
      for (int64_t& i : ids) i = num_rows > 0 ? id(random) : id(random) << 40;
      std::vector<float> g(ids.size() * 8);
      for (float& x : g) x = grad(random);
      std::vector<float> want(ids.size() * 8);
      ASSERT_TRUE(reference.Pull(ids, absl::MakeSpan(want)).ok());
      EXPECT_EQ(Pull(rows, name, ids), want) << name << " " << round;
      ASSERT_TRUE(rows->PushRows(name, ids, g).ok());
      // The client sums repeats before sending, the reference table as it
      // applies: the same sums, added in the same order.
      ASSERT_TRUE(reference.Push(ids, g).ok());
    }
    if (clicks_rows == 0) clicks_rows = reference.rows();
    std::vector<int64_t> all;
    for (int64_t i = 0; i <= 200; ++i)
      all.push_back(num_rows > 0 ? i : i << 40);
    std::vector<float> want(all.size() * 8);
    ASSERT_TRUE(reference.Pull(all, absl::MakeSpan(want)).ok());
    const std::vector<float> got = Pull(rows, name, all);
    for (size_t k = 0; k < got.size(); ++k) {
      ASSERT_NEAR(got[k], want[k], 1e-6) << name << " element " << k;
    }
  }

  // Each shard says what it holds (Stats, and /metrics from them): the
  // rows pushed (a pull makes none), every pull's and push's rows.
  auto stats = AdminClient(worker_->caller()).StatsAll();
  ASSERT_TRUE(stats.ok()) << stats.status();
  int64_t rows = 0, pulled = 0;
  for (const v1::StatsResponse& s : *stats) {
    ASSERT_EQ(s.embeddings_size(), 3);
    EXPECT_EQ(s.embeddings(0).name(), "clicks");
    EXPECT_GT(s.embeddings(0).rows(), 50) << "ids not spread over shards";
    rows += s.embeddings(0).rows();
    pulled += s.embeddings(0).rows_pulled();
    EXPECT_GT(s.embeddings(0).rows_pushed(), 0);
  }
  EXPECT_EQ(rows, clicks_rows);
  EXPECT_LT(rows, 201) << "some of the 201 ids pulled were never pushed";
  EXPECT_GT(pulled, 201);
  bool exported = false;
  for (const auto& family : StatsToMetrics((*stats)[0])) {
    if (family.name != "asyncps_shard_embedding_rows") continue;
    exported = true;
    ASSERT_EQ(family.metric.size(), 3u);
    EXPECT_EQ(family.metric[0].label[0].value, "clicks");
    EXPECT_EQ(family.metric[0].gauge.value,
              static_cast<double>((*stats)[0].embeddings(0).rows()));
  }
  EXPECT_TRUE(exported);
}

// Issue #43: ReadRows paged by slot while pushes evicted rows into slots
// read already, so an export skipped rows or gave one twice. Over gRPC:
// the pages of one read are the table at its first page, whatever pushes
// and evictions come between them; a read the shard does not hold is
// refused, saying to start over.
TEST_F(EmbeddingTest, TheShardsPagesOfOneReadAreASnapshot) {
  v1::EmbeddingSpec spec = Spec("bounded", v1::OptimizerSpec::SGD, 0);
  spec.set_max_rows_per_shard(6);
  ASSERT_TRUE(rows_->Declare(spec).ok());
  std::vector<int64_t> first, next;  // Ids shard 0 holds.
  for (int64_t id = 0; next.size() < 6; ++id) {
    if (RowShard(id, 2) != 0) continue;
    (first.size() < 6 ? first : next).push_back(id);
  }
  const std::vector<float> g(6 * 8, 1.0f);
  ASSERT_TRUE(rows_->PushRows("bounded", first, g).ok());
  const std::vector<float> want = Pull(rows_.get(), "bounded", first);
  auto page = [&](int64_t start, int64_t max_rows, uint64_t snapshot) {
    v1::ReadRowsRequest request;
    request.set_table("bounded");
    request.set_start(start);
    request.set_max_rows(max_rows);
    request.set_snapshot(snapshot);
    return worker_->caller()->CallOne<v1::ReadRowsResponse>(
        0, request, ASYNCPS_RPC(ReadRows), "ReadRows", /*idempotent=*/true);
  };
  auto one = page(0, 2, 0);
  ASSERT_TRUE(one.ok()) << one.status();
  ASSERT_EQ(one->next(), 2);
  // Six new rows evict the six read or about to be.
  ASSERT_TRUE(rows_->PushRows("bounded", next, g).ok());
  auto two = page(2, 4, one->snapshot());
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->next(), -1);
  std::map<int64_t, std::vector<float>> got;
  for (const auto* p : {&*one, &*two}) {
    const size_t n = p->ids().size() / sizeof(int64_t);
    for (size_t k = 0; k < n; ++k) {
      int64_t id;
      std::memcpy(&id, p->ids().data() + k * sizeof(id), sizeof(id));
      std::vector<float> row(8);
      std::memcpy(row.data(), p->rows().data() + k * 8 * sizeof(float),
                  8 * sizeof(float));
      EXPECT_TRUE(got.emplace(id, row).second) << "id " << id << " twice";
    }
  }
  ASSERT_EQ(got.size(), first.size());
  for (size_t k = 0; k < first.size(); ++k) {
    EXPECT_EQ(got[first[k]], std::vector<float>(want.begin() + k * 8,
                                                want.begin() + k * 8 + 8))
        << "id " << first[k];
  }
  // The read ended with its last page.
  auto ended = page(0, 2, one->snapshot());
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kFailedPrecondition)
      << ended.status();
  EXPECT_NE(ended.status().message().find("read again from the start"),
            std::string::npos);
  // psctl export's read: the rows held now, each once.
  std::vector<int64_t> ids;
  std::vector<float> rows;
  ASSERT_TRUE(rows_->ReadAll("bounded", &ids, &rows).ok());
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end());
}

TEST_F(EmbeddingTest, BadRequestsAndStrangersChangeNoRow) {
  const v1::EmbeddingSpec spec = Spec("items", v1::OptimizerSpec::ADAGRAD, 100);
  ASSERT_TRUE(rows_->Declare(spec).ok());
  const std::vector<int64_t> ids = {1, 2, 3, 50, 99};
  const std::vector<float> before = Pull(rows_.get(), "items", ids);
  std::vector<float> g(ids.size() * 8, 1.0f);

  std::vector<int64_t> outside = {1, 100};
  EXPECT_EQ(
      rows_->PushRows("items", outside, std::vector<float>(16, 1.0f)).code(),
      absl::StatusCode::kInvalidArgument);
  std::vector<float> nan = g;
  nan[13] = std::nanf("");
  absl::Status s = rows_->PushRows("items", ids, nan);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is nan at element 5"), std::string::npos) << s;
  EXPECT_EQ(rows_->PushRows("nope", ids, g).code(),
            absl::StatusCode::kNotFound);
  v1::EmbeddingSpec other = spec;
  other.set_dim(16);
  EXPECT_EQ(rows_->Declare(other).code(),
            absl::StatusCode::kFailedPrecondition);

  // A reader may declare a table that is there and pull its rows, but
  // neither make a table nor push.
  auto reader = Client(-1);
  EmbeddingClient stranger(reader->caller());
  EXPECT_EQ(stranger.Declare(Spec("mine", v1::OptimizerSpec::SGD, 0)).code(),
            absl::StatusCode::kPermissionDenied);
  ASSERT_TRUE(stranger.Declare(spec).ok());
  EXPECT_EQ(Pull(&stranger, "items", ids), before);
  EXPECT_EQ(stranger.PushRows("items", ids, g).code(),
            absl::StatusCode::kPermissionDenied);

  // A raw call to the wrong shard is refused: ids live where RowShard says.
  int64_t foreign = 0;
  while (RowShard(foreign, 2) == 0) ++foreign;
  auto stub = v1::ParameterServer::NewStub(grpc::CreateChannel(
      shards_.addresses[0].ToString(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  v1::PullRowsRequest request;
  request.set_table("items");
  request.set_rank(-1);
  request.set_ids(std::string(reinterpret_cast<const char*>(&foreign), 8));
  v1::PullRowsResponse response;
  grpc::Status status = stub->PullRows(&context, request, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("belongs to shard 1"),
            std::string::npos)
      << status.error_message();

  EXPECT_EQ(Pull(rows_.get(), "items", ids), before) << "a refused call "
                                                        "moved a row";
}

}  // namespace
}  // namespace asyncps::testing
