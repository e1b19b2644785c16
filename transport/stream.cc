#include "transport/stream.h"

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

}  // namespace asyncps
