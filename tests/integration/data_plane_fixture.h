// The fixture of the data-plane tests (data_plane_test.cc,
// data_plane_hostile_test.cc): a real shard over loopback with rank 0
// declared through gRPC, clients of either transport, and frames written by
// hand so that a test can break any field of them.
#ifndef ASYNCPS_TESTS_INTEGRATION_DATA_PLANE_FIXTURE_H_
#define ASYNCPS_TESTS_INTEGRATION_DATA_PLANE_FIXTURE_H_

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "client/ps_client.h"
#include "gtest/gtest.h"
#include "tests/integration/local_shards.h"
#include "tests/integration/test_cluster.h"
#include "transport/frame.h"
#include "transport/socket.h"

namespace asyncps::testing {

inline absl::Time Soon() { return absl::Now() + absl::Seconds(10); }

// A header's 32 bytes, written by hand so that tests can break any field.
inline std::string Header(uint32_t magic, uint8_t version, uint8_t op,
                          uint32_t meta, uint32_t payloads,
                          uint64_t payload_bytes) {
  std::string h(kFrameHeaderBytes, '\0');
  std::memcpy(&h[0], &magic, 4);
  h[4] = static_cast<char>(version);
  h[5] = static_cast<char>(op);
  std::memcpy(&h[8], &meta, 4);
  std::memcpy(&h[12], &payloads, 4);
  std::memcpy(&h[16], &payload_bytes, 8);
  return h;
}

// A frame written on the plain socket `fd`.
inline absl::Status Send(int fd, FrameHeader h,
                         google::protobuf::MessageLite* meta,
                         const std::vector<std::string*>& payloads = {}) {
  TcpStream stream(fd);
  return WriteFrame(&stream, h, meta, payloads, Soon());
}

inline std::string Op(FrameOp op, uint32_t meta, uint32_t payloads = 0,
                      uint64_t payload_bytes = 0) {
  return Header(kFrameMagic, kFrameVersion, static_cast<uint8_t>(op), meta,
                payloads, payload_bytes);
}

// A gradient push of `values` (12 of them) for tensor t0's one slice.
// A push of `values` as rank 0 holding `secret`.
inline v1::PushRequest PushOf(const std::vector<float>& values,
                              uint64_t secret) {
  v1::PushRequest push;
  push.set_secret(secret);
  v1::SliceData* g = push.add_gradients();
  g->mutable_key()->set_tensor("t0");
  g->mutable_key()->set_count(values.size());
  g->set_dtype(v1::DTYPE_F32);
  g->set_data(std::string(reinterpret_cast<const char*>(values.data()),
                          values.size() * sizeof(float)));
  return push;
}

// Bytes a client sends, and what the refusal must say.
struct Refusal {
  std::string bytes;
  std::string says;
};

class DataPlaneTest : public ::testing::Test {
 protected:
  void SetUp() override { Start(ShardServerConfig()); }

  void Start(ShardServerConfig config) {
    config.host = "127.0.0.1";
    config.security = server_security_;
    auto server = ShardServer::Start(config);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    next_rank_ = 0;
    grpc_ = Client(Transport::kGrpc);  // Rank 0.
    ASSERT_TRUE(grpc_->DeclareModel(spec_).ok());
    v1::RegisterRequest again;  // Rank 0 again, for raw frames' secret.
    again.set_rank(0);
    again.set_num_workers(kJobSize);
    auto joined = grpc_->caller()->Register(0, again);
    ASSERT_TRUE(joined.ok()) << joined.status();
    secret_ = joined->secret();
  }

  std::unique_ptr<PsClient> Client(Transport transport,
                                   v1::DType dtype = v1::DTYPE_F32) {
    PsClientOptions options;
    options.servers = {ServerAddress{"127.0.0.1", server_->port()}};
    options.transport = transport;
    options.wire_dtype = dtype;
    options.security = client_security_;
    options.retry_for = absl::Seconds(10);
    options.backoff_initial = absl::Milliseconds(5);
    auto client = PsClient::Create(options);
    EXPECT_TRUE(client.ok());
    EXPECT_TRUE((*client)->UseModel(spec_).ok());
    // Each client is a worker of its own rank.
    EXPECT_TRUE((*client)->Join(next_rank_++, kJobSize).ok());
    return *std::move(client);
  }

  std::vector<float> Weights() {
    std::vector<std::vector<float>> w = {std::vector<float>(12)};
    std::vector<SliceVersion> versions;
    EXPECT_TRUE(grpc_->Pull({0}, &w, &versions, -1, 0).ok());
    return w[0];
  }

  // A connection that has presented the right token.
  Socket Welcomed() {
    auto s = ConnectTcp("127.0.0.1", server_->data_port(), Soon());
    EXPECT_TRUE(s.ok()) << s.status();
    v1::DataHello hello;
    hello.set_token(Token());
    FrameHeader h;
    h.op = FrameOp::kHello;
    EXPECT_TRUE(Send(s->fd(), h, &hello).ok());
    EXPECT_TRUE(Answer(s->fd()).ok());
    return *std::move(s);
  }

  std::string Token() { return server_->data_token(); }

  // Reads one answer: its status (OK: an empty-bodied answer was skipped).
  absl::Status Answer(int fd) {
    TcpStream stream(fd);
    auto h = ReadHeader(&stream, 1 << 20, Soon());
    if (!h.ok()) return h.status();
    if (h->code != 0) {
      absl::Status answer;
      absl::Status read = ReadError(&stream, *h, Soon(), &answer);
      return read.ok() ? answer : read;
    }
    return SkipBytes(&stream, h->BodyBytes(), Soon());
  }

  // Sends `bytes`, reads the answer, and checks that the server then
  // closed the connection.
  absl::Status SendAndExpectClose(Socket s, const std::string& bytes) {
    iovec part{const_cast<char*>(bytes.data()), bytes.size()};
    EXPECT_TRUE(WriteFull(s.fd(), {&part, 1}, Soon()).ok());
    absl::Status answer = Answer(s.fd());
    char c;
    EXPECT_EQ(ReadFull(s.fd(), &c, 1, Soon()).code(),
              absl::StatusCode::kUnavailable)
        << "the connection should be closed";
    return answer;
  }

  // Each of `cases`, sent on a welcomed connection, is answered `code`
  // with a message saying what it must, and closes the connection; then
  // the shard still serves, no weight moved.
  void ExpectRefused(const std::vector<Refusal>& cases, absl::StatusCode code) {
    for (const Refusal& c : cases) {
      absl::Status a = SendAndExpectClose(Welcomed(), c.bytes);
      EXPECT_EQ(a.code(), code) << c.says;
      EXPECT_NE(a.message().find(c.says), std::string::npos) << a;
    }
    ExpectServing();
  }

  void ExpectServing() {
    auto client = Client(Transport::kTcp);
    std::vector<std::vector<float>> w = {std::vector<float>(12)};
    std::vector<SliceVersion> versions;
    EXPECT_TRUE(client->Pull({0}, &w, &versions, -1, 0).ok());
    EXPECT_EQ(Weights(), std::vector<float>(12, 1.0f)) << "a weight moved";
  }

  const v1::ModelSpec spec_ = ConstantSpec({{4, 3}}, 1, 1.0f, 0.5f, 1024);
  // Empty: plaintext.
  Security server_security_;
  Security client_security_;
  std::unique_ptr<ShardServer> server_;
  std::unique_ptr<PsClient> grpc_;
  static constexpr int kJobSize = 64;
  int next_rank_ = 0;
  uint64_t secret_ = 0;  // Rank 0's, for requests written by hand.
};

}  // namespace asyncps::testing

#endif  // ASYNCPS_TESTS_INTEGRATION_DATA_PLANE_FIXTURE_H_
