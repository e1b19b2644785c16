#include "client/data_channel.h"

#include <utility>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace asyncps {

absl::StatusOr<std::unique_ptr<DataConnection>> DataConnection::Open(
    const DataPlaneAddress& address, const TlsContext* tls,
    uint64_t max_frame_bytes, absl::Time deadline) {
  ASSIGN_OR_RETURN(DataPlaneConnection dialed,
                   DialDataPlane(address, tls, deadline));
  return std::unique_ptr<DataConnection>(
      new DataConnection(std::move(dialed), max_frame_bytes));
}

absl::Status DataConnection::SendFrame(
    FrameOp op, google::protobuf::MessageLite* request,
    const std::vector<std::string*>& payloads, absl::Duration timeout,
    absl::Time deadline) {
  FrameHeader header;
  header.op = op;
  header.timeout_ms = static_cast<uint32_t>(
      std::min<int64_t>(absl::ToInt64Milliseconds(timeout), UINT32_MAX));
  absl::Status s =
      WriteFrame(stream_.get(), header, request, payloads, deadline);
  broken_ = broken_ || !s.ok();
  return s;
}

absl::Status DataConnection::ReceiveFrame(
    google::protobuf::MessageLite* response,
    const std::function<std::vector<std::string*>()>& fields,
    absl::Time deadline) {
  // Any failure, an error answer included, retires the connection: after
  // a refused frame the server may close it.
  broken_ = true;
  ASSIGN_OR_RETURN(FrameHeader header,
                   ReadHeader(stream_.get(), max_frame_bytes_, deadline));
  if (header.op != FrameOp::kAnswer) {
    return absl::InternalError("the data plane sent a request, not an answer");
  }
  if (header.code != 0) {
    absl::Status answer;
    RETURN_IF_ERROR(ReadError(stream_.get(), header, deadline, &answer));
    return answer;
  }
  absl::Status s = ReadBody(stream_.get(), header, response, fields, deadline);
  if (s.code() == absl::StatusCode::kInvalidArgument) {
    return absl::InternalError(
        absl::StrCat("malformed answer from the data plane: ", s.message()));
  }
  RETURN_IF_ERROR(s);
  broken_ = false;
  return absl::OkStatus();
}

absl::StatusOr<size_t> DataConnection::WaitAny(
    absl::Span<DataConnection* const> connections, absl::Time deadline) {
  absl::InlinedVector<Stream*, 4> streams;
  for (DataConnection* c : connections) streams.push_back(c->stream_.get());
  return WaitAnyReadable(streams, deadline);
}

absl::StatusOr<std::unique_ptr<DataConnection>> DataChannel::Take(
    absl::Time deadline) {
  std::optional<DataPlaneAddress> address;
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<DataConnection> c = std::move(idle_.back());
      idle_.pop_back();
      return c;
    }
    address = address_;
  }
  if (!address.has_value()) {
    ASSIGN_OR_RETURN(address, discover_(deadline));
    absl::MutexLock lock(&mu_);
    address_ = address;
  }
  if (address->port == 0) {
    return absl::FailedPreconditionError(
        "the shard serves no data plane (it runs with --data_port=-1); run "
        "the client with --transport=grpc");
  }
  auto c =
      DataConnection::Open(*address, tls_.get(), max_frame_bytes_, deadline);
  if (!c.ok()) Reset();
  return c;
}

void DataChannel::Give(std::unique_ptr<DataConnection> connection) {
  if (connection->broken()) return;
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(connection));
}

void DataChannel::Reset() {
  std::vector<std::unique_ptr<DataConnection>> idle;
  absl::MutexLock lock(&mu_);
  address_.reset();
  idle.swap(idle_);
}

}  // namespace asyncps
