// The data plane's framing: how Pull, Push and PushPull travel over a TCP
// connection (plain or TLS: transport/stream.h) instead of gRPC. A frame is
//
//   header (32 bytes, little-endian)
//   meta   (meta_bytes: the request or response protobuf, its tensor
//           payload fields left empty; or, in an error answer, the message)
//   lengths (num_payloads x u64: each payload's size)
//   payloads (the tensor bytes, in the order PayloadFields lists them)
//
// so a tensor goes from the encoder's buffer to the socket and from the
// socket to the decoder's buffer with no protobuf copy on either side. The
// messages are the gRPC service's own (proto/asyncps.proto), so both
// transports share every rule about their contents. docs/PROTOCOL.md has
// the byte layout.
#ifndef ASYNCPS_TRANSPORT_FRAME_H_
#define ASYNCPS_TRANSPORT_FRAME_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "google/protobuf/message_lite.h"
#include "proto/asyncps.pb.h"
#include "transport/stream.h"

namespace asyncps {

// "APS1" read as a little-endian u32.
inline constexpr uint32_t kFrameMagic = 0x31535041;
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 32;

// What a frame asks for (or that it answers one).
enum class FrameOp : uint8_t {
  kHello = 1,  // First frame of a connection: v1::DataHello.
  kPull = 2,
  kPush = 3,
  kPushPull = 4,
  kAnswer = 5,    // The answer to the frame before it.
  kPullRows = 6,  // Sparse rows (docs/SPARSE.md).
  kPushRows = 7,
  // Between the members of a replicated shard (server/replication.h): a
  // backup's v1::ReplicaJoin, then the primary's v1::ReplicaOp frames, each
  // answered with a v1::ReplicaAck.
  kJoin = 8,
  kReplicate = 9,
};
// The highest op a frame may carry.
inline constexpr FrameOp kLastFrameOp = FrameOp::kReplicate;

struct FrameHeader {
  FrameOp op = FrameOp::kAnswer;
  // kAnswer: an absl::StatusCode; OK carries the response, any other code
  // carries its message as meta.
  uint16_t code = 0;
  uint32_t meta_bytes = 0;
  uint32_t num_payloads = 0;
  uint64_t payload_bytes = 0;  // Sum of the payloads' sizes.
  // Requests: how long the caller will wait for the answer, in ms (0: no
  // limit); a held pull is answered DEADLINE_EXCEEDED after it.
  uint32_t timeout_ms = 0;

  // Bytes that follow the header.
  uint64_t BodyBytes() const {
    return uint64_t{meta_bytes} + 8 * uint64_t{num_payloads} + payload_bytes;
  }
};

// The tensor payload fields of each message the data plane carries, in
// the order they travel (none for messages without tensors).
std::vector<std::string*> PayloadFields(v1::PullRequest* m);
std::vector<std::string*> PayloadFields(v1::PullResponse* m);
std::vector<std::string*> PayloadFields(v1::PushRequest* m);
std::vector<std::string*> PayloadFields(v1::PushResponse* m);
std::vector<std::string*> PayloadFields(v1::PushPullRequest* m);
std::vector<std::string*> PayloadFields(v1::PushPullResponse* m);
std::vector<std::string*> PayloadFields(v1::DataHello* m);
std::vector<std::string*> PayloadFields(v1::PullRowsRequest* m);
std::vector<std::string*> PayloadFields(v1::PullRowsResponse* m);
std::vector<std::string*> PayloadFields(v1::PushRowsRequest* m);
std::vector<std::string*> PayloadFields(v1::PushRowsResponse* m);
std::vector<std::string*> PayloadFields(v1::ReplicaJoin* m);
std::vector<std::string*> PayloadFields(v1::ReplicaOp* m);
std::vector<std::string*> PayloadFields(v1::ReplicaAck* m);

// Writes one frame: `header` (its sizes filled in here), then `meta` with
// `payloads` moved out of it while it is serialized (they are moved back
// before returning, so `meta` is unchanged), then the payloads themselves.
absl::Status WriteFrame(Stream* stream, FrameHeader header,
                        google::protobuf::MessageLite* meta,
                        const std::vector<std::string*>& payloads,
                        absl::Time deadline);

// Writes an error answer carrying `status`'s code and message.
// REQUIRES: !status.ok().
absl::Status WriteError(Stream* stream, const absl::Status& status,
                        absl::Time deadline);

// Reads and checks a header: magic, version, a known op, and a body of at
// most `max_body_bytes`. INVALID_ARGUMENT or RESOURCE_EXHAUSTED say what
// was wrong; the connection cannot be trusted after any error.
absl::StatusOr<FrameHeader> ReadHeader(Stream* stream, uint64_t max_body_bytes,
                                       absl::Time deadline);

// Reads the body `header` announces into `meta` and its payload fields.
// INVALID_ARGUMENT if the meta does not parse, or its payload fields do not
// match the announced count and sizes.
// REQUIRES: `header` is not an error answer (code 0).
// `spare`, if given, holds buffers of earlier frames: a payload whose size
// matches the spare at its position is read into that one (swapped in), so a
// connection that carries the same shapes again and again neither allocates
// nor zeroes them. Give them back with KeepSpares.
absl::Status ReadBody(Stream* stream, const FrameHeader& header,
                      google::protobuf::MessageLite* meta,
                      const std::function<std::vector<std::string*>()>& fields,
                      absl::Time deadline,
                      std::vector<std::string>* spare = nullptr);

// Moves the payload buffers `fields` out of a message into the first
// positions of `spare` (kept for the next ReadBody; spares beyond them stay).
void KeepSpares(const std::vector<std::string*>& fields,
                std::vector<std::string>* spare);

// Reads the body of an error answer into `*answer` (its code and
// message); returns the transport's status.
// REQUIRES: header.op == kAnswer and header.code != 0.
absl::Status ReadError(Stream* stream, const FrameHeader& header,
                       absl::Time deadline, absl::Status* answer);

// Reads and drops `n` bytes (the rest of a frame that is refused whole).
absl::Status SkipBytes(Stream* stream, uint64_t n, absl::Time deadline);

}  // namespace asyncps

#endif  // ASYNCPS_TRANSPORT_FRAME_H_
