#include "transport/frame.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tensor_bytes.h"  // Asserts a little-endian host.

namespace asyncps {
namespace {

template <typename T>
void Put(char* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}

template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Header layout: magic u32 @0, version u8 @4, op u8 @5, code u16 @6,
// meta_bytes u32 @8, num_payloads u32 @12, payload_bytes u64 @16,
// timeout_ms u32 @24, reserved u32 @28 (zero).
void EncodeHeader(const FrameHeader& h, char* out) {
  std::memset(out, 0, kFrameHeaderBytes);
  Put<uint32_t>(out, kFrameMagic);
  Put<uint8_t>(out + 4, kFrameVersion);
  Put<uint8_t>(out + 5, static_cast<uint8_t>(h.op));
  Put<uint16_t>(out + 6, h.code);
  Put<uint32_t>(out + 8, h.meta_bytes);
  Put<uint32_t>(out + 12, h.num_payloads);
  Put<uint64_t>(out + 16, h.payload_bytes);
  Put<uint32_t>(out + 24, h.timeout_ms);
}

void AddSliceData(google::protobuf::RepeatedPtrField<v1::SliceData>* slices,
                  std::vector<std::string*>* out) {
  for (v1::SliceData& d : *slices) out->push_back(d.mutable_data());
}

}  // namespace

std::vector<std::string*> PayloadFields(v1::PullRequest*) { return {}; }
std::vector<std::string*> PayloadFields(v1::PushResponse*) { return {}; }
std::vector<std::string*> PayloadFields(v1::DataHello*) { return {}; }

std::vector<std::string*> PayloadFields(v1::PullRowsRequest* m) {
  return {m->mutable_ids()};
}

std::vector<std::string*> PayloadFields(v1::PullRowsResponse* m) {
  return {m->mutable_rows()};
}

std::vector<std::string*> PayloadFields(v1::PushRowsRequest* m) {
  return {m->mutable_ids(), m->mutable_grads(), m->mutable_pull_ids()};
}

std::vector<std::string*> PayloadFields(v1::PushRowsResponse* m) {
  return {m->mutable_rows()};
}

std::vector<std::string*> PayloadFields(v1::ReplicaJoin*) { return {}; }

std::vector<std::string*> PayloadFields(v1::ReplicaAck*) { return {}; }

// The payloads of whichever op it carries (the meta says which, so the
// reader knows them too).
std::vector<std::string*> PayloadFields(v1::ReplicaOp* m) {
  std::vector<std::string*> out;
  switch (m->op_case()) {
    case v1::ReplicaOp::kPush:
      AddSliceData(m->mutable_push()->mutable_gradients(), &out);
      break;
    case v1::ReplicaOp::kAssign:
      AddSliceData(m->mutable_assign()->mutable_weights(), &out);
      break;
    case v1::ReplicaOp::kSnapshotChunk:
      out.push_back(m->mutable_snapshot_chunk()->mutable_chunk());
      break;
    default:
      break;
  }
  return out;
}

std::vector<std::string*> PayloadFields(v1::PullResponse* m) {
  std::vector<std::string*> out;
  AddSliceData(m->mutable_slices(), &out);
  return out;
}

std::vector<std::string*> PayloadFields(v1::PushRequest* m) {
  std::vector<std::string*> out;
  AddSliceData(m->mutable_gradients(), &out);
  return out;
}

std::vector<std::string*> PayloadFields(v1::PushPullRequest* m) {
  return PayloadFields(m->mutable_push());
}

std::vector<std::string*> PayloadFields(v1::PushPullResponse* m) {
  return PayloadFields(m->mutable_pull());
}

absl::Status WriteFrame(Stream* stream, FrameHeader header,
                        google::protobuf::MessageLite* meta,
                        const std::vector<std::string*>& payloads,
                        absl::Time deadline) {
  // Move the tensors out so that serializing the rest copies none of them.
  std::vector<std::string> taken(payloads.size());
  std::vector<uint64_t> lengths(payloads.size());
  uint64_t total = 0;
  for (size_t k = 0; k < payloads.size(); ++k) {
    taken[k].swap(*payloads[k]);
    lengths[k] = taken[k].size();
    total += lengths[k];
  }
  std::string serialized;
  const bool ok = meta->SerializeToString(&serialized);
  for (size_t k = 0; k < payloads.size(); ++k) taken[k].swap(*payloads[k]);
  if (!ok) return absl::InternalError("cannot serialize a frame's meta");

  header.meta_bytes = static_cast<uint32_t>(serialized.size());
  header.num_payloads = static_cast<uint32_t>(payloads.size());
  header.payload_bytes = total;
  char head[kFrameHeaderBytes];
  EncodeHeader(header, head);
  std::vector<iovec> parts;
  parts.reserve(3 + payloads.size());
  parts.push_back({head, sizeof(head)});
  parts.push_back({serialized.data(), serialized.size()});
  parts.push_back({lengths.data(), lengths.size() * sizeof(uint64_t)});
  for (std::string* p : payloads) parts.push_back({p->data(), p->size()});
  return stream->WriteFull(parts, deadline);
}

absl::Status WriteError(Stream* stream, const absl::Status& status,
                        absl::Time deadline) {
  FrameHeader header;
  header.op = FrameOp::kAnswer;
  header.code = static_cast<uint16_t>(status.code());
  const absl::string_view message = status.message();
  header.meta_bytes = static_cast<uint32_t>(message.size());
  char head[kFrameHeaderBytes];
  EncodeHeader(header, head);
  iovec parts[2] = {{head, sizeof(head)},
                    {const_cast<char*>(message.data()), message.size()}};
  return stream->WriteFull(parts, deadline);
}

absl::StatusOr<FrameHeader> ReadHeader(Stream* stream, uint64_t max_body_bytes,
                                       absl::Time deadline) {
  char head[kFrameHeaderBytes];
  RETURN_IF_ERROR(stream->ReadFull(head, sizeof(head), deadline));
  if (Get<uint32_t>(head) != kFrameMagic) {
    return absl::InvalidArgumentError(
        "not an asyncps data-plane frame (bad magic)");
  }
  if (Get<uint8_t>(head + 4) != kFrameVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane frame version ", Get<uint8_t>(head + 4),
                     "; this process speaks version ", kFrameVersion));
  }
  const uint8_t op = Get<uint8_t>(head + 5);
  if (op < static_cast<uint8_t>(FrameOp::kHello) ||
      op > static_cast<uint8_t>(kLastFrameOp)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown data-plane op ", op));
  }
  FrameHeader h;
  h.op = static_cast<FrameOp>(op);
  h.code = Get<uint16_t>(head + 6);
  h.meta_bytes = Get<uint32_t>(head + 8);
  h.num_payloads = Get<uint32_t>(head + 12);
  h.payload_bytes = Get<uint64_t>(head + 16);
  h.timeout_ms = Get<uint32_t>(head + 24);
  if (h.code > static_cast<uint16_t>(absl::StatusCode::kUnauthenticated)) {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown status code ", h.code, " in a data-plane frame"));
  }
  // Each part below the limit first, so their sum cannot overflow.
  if (h.payload_bytes > max_body_bytes || h.BodyBytes() > max_body_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("data-plane frame of ", h.meta_bytes, " + ",
                     8 * uint64_t{h.num_payloads}, " + ", h.payload_bytes,
                     " bytes exceeds the limit of ", max_body_bytes,
                     " (--max_message_bytes)"));
  }
  return h;
}

absl::Status ReadBody(Stream* stream, const FrameHeader& header,
                      google::protobuf::MessageLite* meta,
                      const std::function<std::vector<std::string*>()>& fields,
                      absl::Time deadline, std::vector<std::string>* spare) {
  std::string bytes(header.meta_bytes, '\0');
  RETURN_IF_ERROR(stream->ReadFull(bytes.data(), bytes.size(), deadline));
  if (!meta->ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data-plane frame's meta (", bytes.size(), " bytes) does not parse"));
  }
  std::vector<std::string*> payloads = fields();
  if (payloads.size() != header.num_payloads) {
    return absl::InvalidArgumentError(
        absl::StrCat("data-plane frame announces ", header.num_payloads,
                     " payloads; its meta has ", payloads.size(), " tensors"));
  }
  std::vector<uint64_t> lengths(payloads.size());
  RETURN_IF_ERROR(stream->ReadFull(reinterpret_cast<char*>(lengths.data()),
                                   lengths.size() * sizeof(uint64_t),
                                   deadline));
  uint64_t total = 0;
  bool fits = true;
  for (uint64_t n : lengths) {
    fits = fits && n <= header.payload_bytes - total;
    if (fits) total += n;
  }
  if (!fits || total != header.payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "data-plane frame's payload lengths do not add up to the announced ",
        header.payload_bytes, " bytes"));
  }
  for (size_t k = 0; k < payloads.size(); ++k) {
    std::string* p = payloads[k];
    if (spare != nullptr && k < spare->size() &&
        (*spare)[k].size() == lengths[k]) {
      p->swap((*spare)[k]);
    } else {
      // Fresh storage of the right size (what the meta put there goes).
      p->clear();
      p->resize(lengths[k]);
    }
    RETURN_IF_ERROR(stream->ReadFull(p->data(), p->size(), deadline));
  }
  return absl::OkStatus();
}

void KeepSpares(const std::vector<std::string*>& fields,
                std::vector<std::string>* spare) {
  // Never shrinks: a frame without tensors (a Pull) between two pushes
  // must not throw the pushes' buffers away.
  if (spare->size() < fields.size()) spare->resize(fields.size());
  for (size_t k = 0; k < fields.size(); ++k) (*spare)[k].swap(*fields[k]);
}

absl::Status ReadError(Stream* stream, const FrameHeader& header,
                       absl::Time deadline, absl::Status* answer) {
  std::string message(header.meta_bytes, '\0');
  RETURN_IF_ERROR(stream->ReadFull(message.data(), message.size(), deadline));
  RETURN_IF_ERROR(
      SkipBytes(stream, header.BodyBytes() - header.meta_bytes, deadline));
  *answer = absl::Status(static_cast<absl::StatusCode>(header.code), message);
  return absl::OkStatus();
}

absl::Status SkipBytes(Stream* stream, uint64_t n, absl::Time deadline) {
  char buf[64 << 10];
  while (n > 0) {
    const size_t take = static_cast<size_t>(std::min<uint64_t>(n, sizeof(buf)));
    RETURN_IF_ERROR(stream->ReadFull(buf, take, deadline));
    n -= take;
  }
  return absl::OkStatus();
}

}  // namespace asyncps
