// wire_bench: the ceilings ps_bench is compared with, measured over
// loopback between two processes (this one and a child it forks):
//   --transport=tcp   plain sockets: a 9-byte header, then the payload
//                     (push: acknowledged with one byte; pull: answered);
//   --transport=grpc  the "naive gRPC" ceiling: the plain client a user
//                     writes first. A synchronous generated stub on one
//                     channel made once, one unary call at a time, one
//                     `bytes` field (tools/bench/bench.proto), against a plain
//                     synchronous service; default options on both sides
//                     except the max send/receive message size (unlimited).
//                     Both processes keep MiB-sized buffers in the heap
//                     (KeepLargeBuffers), as ps_bench and ps_server do.
//                     --frame, --lookahead and --read_chunk leave the
//                     defaults (tuning experiments only; the line says so).
// Prints two lines: "wire_bench ceiling: ..." saying what was measured, then
// "wire_bench transport=... op=... bytes=N rounds_per_s=R gb_per_s=G"
// (G counts payload bytes only). Connecting and a first call happen before
// the clock starts.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/large_buffers.h"
#include "tools/bench/bench.grpc.pb.h"

ABSL_FLAG(std::string, transport, "tcp", "tcp or grpc.");
ABSL_FLAG(std::string, op, "push", "push (client to server) or pull.");
ABSL_FLAG(int64_t, bytes, 1 << 20, "Payload bytes per call.");
ABSL_FLAG(double, seconds, 3, "How long to measure.");
ABSL_FLAG(int, frame, 0, "grpc: HTTP/2 max frame size (0: gRPC's default).");
ABSL_FLAG(int, lookahead, 0,
          "grpc: HTTP/2 stream lookahead bytes (0: default).");
ABSL_FLAG(int, read_chunk, 0, "grpc: TCP read chunk size (0: default).");

namespace asyncps::bench {
namespace {

bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool ReadAll(int fd, char* p, size_t n) {
  while (n > 0) {
    const ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

void NoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Child: serves one connection until it closes.
void ServeTcp(int listener) {
  const int fd = accept(listener, nullptr, nullptr);
  if (fd < 0) _exit(1);
  NoDelay(fd);
  std::vector<char> buf;
  char header[9];
  while (ReadAll(fd, header, sizeof(header))) {
    int64_t n;
    std::memcpy(&n, header + 1, 8);
    buf.resize(static_cast<size_t>(n));
    if (header[0] == 'P') {  // Push: take the payload, acknowledge.
      if (!ReadAll(fd, buf.data(), buf.size())) break;
      const char ack = 1;
      if (!WriteAll(fd, &ack, 1)) break;
    } else if (!WriteAll(fd, buf.data(), buf.size())) {
      break;
    }
  }
  _exit(0);
}

// The plain synchronous service: a handler per call on gRPC's own threads.
class NaiveService final : public Naive::Service {
  grpc::Status Push(grpc::ServerContext*, const Blob* request,
                    Size* response) override {
    response->set_bytes(static_cast<int64_t>(request->data().size()));
    return grpc::Status::OK;
  }
  grpc::Status Pull(grpc::ServerContext*, const Size* request,
                    Blob* response) override {
    if (request->bytes() < 0 || request->bytes() > (int64_t{1} << 31)) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "bad size");
    }
    response->set_data(std::string(static_cast<size_t>(request->bytes()), 'x'));
    return grpc::Status::OK;
  }
};

[[noreturn]] void ServeGrpc(int port_pipe) {
  NaiveService service;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  if (int f = absl::GetFlag(FLAGS_frame))
    builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, f);
  if (int l = absl::GetFlag(FLAGS_lookahead))
    builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, l);
  if (int r = absl::GetFlag(FLAGS_read_chunk))
    builder.AddChannelArgument(GRPC_ARG_TCP_READ_CHUNK_SIZE, r);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  WriteAll(port_pipe, reinterpret_cast<const char*>(&port), sizeof(port));
  server->Wait();  // Until killed.
  _exit(0);
}

// Rounds of `op` over a plain TCP connection to `port` for --seconds
// from *start (set here); false if a call failed.
bool TcpRounds(int port, const std::string& op, int64_t bytes,
               std::string* payload, absl::Time* start, int64_t* rounds) {
  const absl::Duration length = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  bool ok = true;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr = {};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return false;
  }
  NoDelay(fd);
  char header[9];
  header[0] = op == "push" ? 'P' : 'G';
  std::memcpy(header + 1, &bytes, 8);
  *start = absl::Now();
  while (ok && absl::Now() - *start < length) {
    if (op == "push") {
      char ack;
      ok = WriteAll(fd, header, 9) &&
           WriteAll(fd, payload->data(), payload->size()) &&
           ReadAll(fd, &ack, 1);
    } else {
      ok = WriteAll(fd, header, 9) &&
           ReadAll(fd, payload->data(), payload->size());
    }
    ++*rounds;
  }
  close(fd);
  return ok;
}

// One call of `op` as the plain client makes it: a fresh context, the
// payload copied into the request (`set_data`), no deadline (the server is
// our own child; if it dies the call fails UNAVAILABLE).
bool GrpcCall(Naive::Stub& stub, const std::string& op, int64_t bytes,
              const std::string& payload) {
  grpc::ClientContext ctx;
  if (op == "push") {
    Blob blob;
    blob.set_data(payload);
    Size size;
    return stub.Push(&ctx, blob, &size).ok();
  }
  Size size;
  size.set_bytes(bytes);
  Blob blob;
  return stub.Pull(&ctx, size, &blob).ok() &&
         static_cast<int64_t>(blob.data().size()) == bytes;
}

// The same rounds through the plain gRPC client of the Naive service: one
// channel and stub made once and reused. The first call (connecting, HTTP/2
// settings) is made before *start.
bool GrpcRounds(int port, const std::string& op, int64_t bytes,
                const std::string& payload, absl::Time* start,
                int64_t* rounds) {
  const absl::Duration length = absl::Seconds(absl::GetFlag(FLAGS_seconds));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  if (int f = absl::GetFlag(FLAGS_frame))
    args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, f);
  if (int l = absl::GetFlag(FLAGS_lookahead))
    args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, l);
  if (int r = absl::GetFlag(FLAGS_read_chunk))
    args.SetInt(GRPC_ARG_TCP_READ_CHUNK_SIZE, r);
  std::unique_ptr<Naive::Stub> stub = Naive::NewStub(
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), args));
  bool ok = GrpcCall(*stub, op, bytes, payload);
  *start = absl::Now();
  while (ok && absl::Now() - *start < length) {
    ok = GrpcCall(*stub, op, bytes, payload);
    ++*rounds;
  }
  return ok;
}

// The line that says what --transport measured, printed beside the result,
// with the machine's load before the run: gRPC's hand-offs between threads
// suffer far more than a socket loop when other processes share the cores.
std::string CeilingLine(const std::string& transport, double load) {
  char load_text[32];
  std::snprintf(load_text, sizeof(load_text), "%.2f", load);
  const std::string machine =
      absl::StrCat("; machine: ", sysconf(_SC_NPROCESSORS_ONLN),
                   " cores, load average ", load_text, " before the run");
  if (transport == "tcp") {
    return "wire_bench ceiling: raw TCP over loopback, one blocking socket "
           "with TCP_NODELAY, a 9-byte header then the payload, one round "
           "at a time" +
           machine;
  }
  std::string line = absl::StrCat(
      "wire_bench ceiling: naive gRPC = plain synchronous gRPC C++ ",
      grpc::Version(),
      ": generated Naive::Stub on one channel made once, one "
      "unary call at a time, payload in one proto3 bytes field, against a "
      "synchronous Naive::Service; default options except max send/receive "
      "message size = unlimited; glibc malloc keeps MiB buffers "
      "(KeepLargeBuffers, as in ps_bench and ps_server)");
  if (int f = absl::GetFlag(FLAGS_frame))
    absl::StrAppend(&line, "; TUNED max_frame_size=", f);
  if (int l = absl::GetFlag(FLAGS_lookahead))
    absl::StrAppend(&line, "; TUNED stream_lookahead_bytes=", l);
  if (int r = absl::GetFlag(FLAGS_read_chunk))
    absl::StrAppend(&line, "; TUNED tcp_read_chunk_size=", r);
  return line + machine;
}

int Run() {
  const std::string transport = absl::GetFlag(FLAGS_transport);
  const std::string op = absl::GetFlag(FLAGS_op);
  const int64_t bytes = absl::GetFlag(FLAGS_bytes);
  if ((transport != "tcp" && transport != "grpc") ||
      (op != "push" && op != "pull") || bytes < 1) {
    std::fprintf(stderr, "wire_bench: bad --transport, --op or --bytes\n");
    return 2;
  }
  double load = -1;  // The last minute's, before this run adds to it.
  getloadavg(&load, 1);
  int port = 0;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return 1;
  int listener = -1;
  if (transport == "tcp") {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr = {};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (bind(listener, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
        listen(listener, 1) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return 1;
    }
    port = ntohs(addr.sin_port);
  }
  const pid_t child = fork();
  if (child == 0) {
    if (transport == "tcp") ServeTcp(listener);
    ServeGrpc(pipe_fds[1]);
  }
  if (transport == "grpc" &&
      !ReadAll(pipe_fds[0], reinterpret_cast<char*>(&port), sizeof(port))) {
    return 1;
  }
  std::string payload(static_cast<size_t>(bytes), 'x');
  int64_t rounds = 0;
  absl::Time start;
  const bool ok = transport == "tcp"
                      ? TcpRounds(port, op, bytes, &payload, &start, &rounds)
                      : GrpcRounds(port, op, bytes, payload, &start, &rounds);
  const double secs = absl::ToDoubleSeconds(absl::Now() - start);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  if (!ok) {
    std::fprintf(stderr, "wire_bench: a call failed\n");
    return 1;
  }
  std::printf("%s\n", CeilingLine(transport, load).c_str());
  std::printf(
      "wire_bench transport=%s op=%s bytes=%lld rounds_per_s=%.1f "
      "gb_per_s=%.3f\n",
      transport.c_str(), op.c_str(), static_cast<long long>(bytes),
      rounds / secs, static_cast<double>(bytes) * rounds / secs / 1e9);
  return 0;
}

}  // namespace
}  // namespace asyncps::bench

int main(int argc, char** argv) {
  // As every asyncps binary does (ps_bench and ps_server included), so that
  // a ratio against this ceiling compares transports, not allocator
  // settings: without it each MiB-sized message is mapped afresh and paid
  // for in page faults.
  asyncps::KeepLargeBuffers();
  absl::ParseCommandLine(argc, argv);
  return asyncps::bench::Run();
}
