// Stream: the bytes of one data-plane connection, read and written with
// deadlines: plain TCP (TcpStream, over transport/socket.h) or TLS over it
// (transport/tls.h). The frame format (transport/frame.h) is written on a
// Stream, so both carry the same frames. A Stream borrows its socket's
// descriptor (the Socket that owns it closes it, after the Stream is gone);
// what does not touch the stream's own state (PeerClosed, ShutdownSocket,
// LingerClose) stays with the descriptor. Not thread-safe.
#ifndef ASYNCPS_TRANSPORT_STREAM_H_
#define ASYNCPS_TRANSPORT_STREAM_H_

#include <sys/uio.h>

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace asyncps {

class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  // The connected, non-blocking socket under the stream.
  int fd() const { return fd_; }

  // Reads exactly `n` bytes into `p`. UNAVAILABLE if the peer closes first
  // (or the connection or its TLS breaks), DEADLINE_EXCEEDED if it is
  // silent past `deadline`.
  virtual absl::Status ReadFull(char* p, size_t n, absl::Time deadline) = 0;
  // Writes every byte of `parts`, in order.
  virtual absl::Status WriteFull(absl::Span<const iovec> parts,
                                 absl::Time deadline) = 0;
  // Waits until there is something to read (or the peer closed: the next
  // read says so); DEADLINE_EXCEEDED once `deadline` passes.
  virtual absl::Status WaitReadable(absl::Time deadline) = 0;
  // True if bytes already taken off the socket wait in the stream (TLS
  // reads whole records), which poll(2) on fd() would not report.
  virtual bool Buffered() const { return false; }
  // The common name of the certificate the peer presented (mutual TLS);
  // "" if it presented none (or the stream is not TLS).
  virtual std::string PeerName() const { return ""; }

 protected:
  explicit Stream(int fd) : fd_(fd) {}

 private:
  const int fd_;
};

// Plain TCP: the socket's bytes as they are.
class TcpStream final : public Stream {
 public:
  explicit TcpStream(int fd) : Stream(fd) {}
  absl::Status ReadFull(char* p, size_t n, absl::Time deadline) override;
  absl::Status WriteFull(absl::Span<const iovec> parts,
                         absl::Time deadline) override;
  absl::Status WaitReadable(absl::Time deadline) override;
};

// Waits until one of `streams` has something to read (or its peer closed:
// the next read says so) and returns the index of one that has;
// DEADLINE_EXCEEDED once `deadline` passes. For a caller with answers
// outstanding on several connections, to take whichever comes first.
absl::StatusOr<size_t> WaitAnyReadable(absl::Span<Stream* const> streams,
                                       absl::Time deadline);

}  // namespace asyncps

#endif  // ASYNCPS_TRANSPORT_STREAM_H_
