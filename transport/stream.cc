#include "transport/stream.h"

#include "absl/container/inlined_vector.h"
#include "transport/socket.h"

namespace asyncps {

absl::Status TcpStream::ReadFull(char* p, size_t n, absl::Time deadline) {
  return asyncps::ReadFull(fd(), p, n, deadline);
}

absl::Status TcpStream::WriteFull(absl::Span<const iovec> parts,
                                  absl::Time deadline) {
  return asyncps::WriteFull(fd(), parts, deadline);
}

absl::Status TcpStream::WaitReadable(absl::Time deadline) {
  return asyncps::WaitReadable(fd(), deadline);
}

absl::StatusOr<size_t> WaitAnyReadable(absl::Span<Stream* const> streams,
                                       absl::Time deadline) {
  absl::InlinedVector<int, 4> fds;
  for (size_t k = 0; k < streams.size(); ++k) {
    if (streams[k]->Buffered()) return k;
    fds.push_back(streams[k]->fd());
  }
  return asyncps::WaitAnyReadable(fds, deadline);
}

}  // namespace asyncps
