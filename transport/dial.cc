#include "transport/dial.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "proto/asyncps.pb.h"
#include "transport/frame.h"

namespace asyncps {
namespace {

// A welcome is an empty DataHello; a refusal is a short message.
constexpr uint64_t kMaxWelcomeBytes = 4096;

// `s` with its code and the address in front of its message.
absl::Status At(const DataPlaneAddress& address, const absl::Status& s,
                absl::string_view what = "") {
  return absl::Status(
      s.code(), absl::StrCat("data plane at ", address.host, ":", address.port,
                             what, ": ", s.message()));
}

// Reads the shard's answer to the hello into `*answer` (OK, or its
// refusal); returns the transport's status.
absl::Status ReadWelcome(Stream* stream, absl::Time deadline,
                         absl::Status* answer) {
  ASSIGN_OR_RETURN(FrameHeader header,
                   ReadHeader(stream, kMaxWelcomeBytes, deadline));
  if (header.op != FrameOp::kAnswer) {
    return absl::InvalidArgumentError(
        "the hello was answered with a request, not an answer");
  }
  if (header.code != 0) return ReadError(stream, header, deadline, answer);
  v1::DataHello welcome;
  *answer = absl::OkStatus();
  return ReadBody(
      stream, header, &welcome, [&] { return PayloadFields(&welcome); },
      deadline);
}

}  // namespace

absl::StatusOr<DataPlaneConnection> DialDataPlane(
    const DataPlaneAddress& address, const TlsContext* tls,
    absl::Time deadline) {
  if (address.port <= 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shard at ", address.host,
                     " serves no data plane (port ", address.port, ")"));
  }
  DataPlaneConnection c;
  absl::StatusOr<Socket> socket =
      ConnectTcp(address.host, address.port, deadline);
  if (!socket.ok()) return At(address, socket.status());
  c.socket = *std::move(socket);
  if (tls == nullptr) {
    c.stream = std::make_unique<TcpStream>(c.socket.fd());
  } else {
    absl::StatusOr<std::unique_ptr<Stream>> secured =
        tls->Connect(c.socket.fd(), address.host, deadline);
    if (!secured.ok()) {
      return At(address, absl::UnavailableError(secured.status().message()),
                " (TLS)");
    }
    c.stream = *std::move(secured);
  }
  FrameHeader header;
  header.op = FrameOp::kHello;
  v1::DataHello hello;
  hello.set_token(address.token);
  if (absl::Status s = WriteFrame(c.stream.get(), header, &hello, {}, deadline);
      !s.ok()) {
    return At(address, s, " (hello)");
  }
  // Whatever went wrong from here on, redialing may mend: a wrong token
  // means the shard restarted since it was asked (ask again), and a
  // welcome that breaks or does not come is a shard going away.
  absl::Status answer;
  if (absl::Status s = ReadWelcome(c.stream.get(), deadline, &answer);
      !s.ok()) {
    return At(address, absl::UnavailableError(s.message()),
              " (no welcome to the hello)");
  }
  if (!answer.ok()) {
    return At(address, absl::UnavailableError(answer.message()),
              " refused the connection");
  }
  return c;
}

}  // namespace asyncps
