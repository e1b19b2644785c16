// TCP sockets for the tensor data plane: non-blocking file descriptors
// driven by poll(2), so every read and write is bounded by a deadline and a
// peer that stops sending or reading cannot hang the caller. Errors are
// absl::Status: UNAVAILABLE for a refused, reset or closed connection,
// DEADLINE_EXCEEDED when the deadline passes. Not thread-safe per socket.
#ifndef ASYNCPS_TRANSPORT_SOCKET_H_
#define ASYNCPS_TRANSPORT_SOCKET_H_

#include <sys/uio.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace asyncps {

// An owned socket file descriptor, closed on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& other) noexcept : fd_(other.Release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Close();

 private:
  int fd_ = -1;
};

// A listening socket on host:port (port 0: the kernel picks one; host "" or
// "0.0.0.0": every interface); `*bound_port` gets the port.
absl::StatusOr<Socket> ListenTcp(const std::string& host, int port,
                                 int* bound_port);

// Waits until `listener` has a connection (or is shut down: UNAVAILABLE)
// and accepts it, non-blocking with TCP_NODELAY.
absl::StatusOr<Socket> AcceptTcp(int listener);

// The address of `fd`'s peer, without the port ("127.0.0.1", "::1"); ""
// if it cannot be told.
std::string PeerHost(int fd);

// Connects to host:port (a name or an address) before `deadline`.
absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port,
                                  absl::Time deadline);
// Whether nothing listens at host:port: true if every address refused a
// connection (ECONNREFUSED: no process holds the port), false if one took
// it (it is closed again); an error if neither could be told before
// `deadline` (no answer, no route, no such name).
absl::StatusOr<bool> RefusesConnections(const std::string& host, int port,
                                        absl::Time deadline);

// Reads exactly `n` bytes into `p`. A peer that closes first is UNAVAILABLE
// ("connection closed"), one that is silent past `deadline` is
// DEADLINE_EXCEEDED.
absl::Status ReadFull(int fd, char* p, size_t n, absl::Time deadline);

// Writes every byte of `parts`, in order, with as few system calls as the
// kernel's buffers allow.
absl::Status WriteFull(int fd, absl::Span<const iovec> parts,
                       absl::Time deadline);

// Waits until `fd` has something to read, or the peer closed it, or it was
// shut down (OK in every case: the next read says which), or `deadline`
// passed (DEADLINE_EXCEEDED).
absl::Status WaitReadable(int fd, absl::Time deadline);
// The same for several: the index of one of `fds` that has something to
// read (or closed), for a caller with answers outstanding on several
// connections that takes whichever comes first.
absl::StatusOr<size_t> WaitAnyReadable(absl::Span<const int> fds,
                                       absl::Time deadline);

// Waits until `fd` can take more bytes (or broke: the next write says so),
// or `deadline` passed (DEADLINE_EXCEEDED).
absl::Status WaitWritable(int fd, absl::Time deadline);

// True if the peer has closed the connection (or it broke), without
// reading anything; for a server holding a request whose caller may leave.
bool PeerClosed(int fd);

// Closes our side for writing, then reads and drops what the peer still
// sends until it closes too or `deadline` passes, so that an answer written
// just before is not lost to a reset (the kernel resets a connection closed
// with unread input).
void LingerClose(int fd, absl::Time deadline);

// Makes every blocked or later read and write on `fd` fail at once (from
// another thread); the descriptor stays open until its Socket closes it.
void ShutdownSocket(int fd);

}  // namespace asyncps

#endif  // ASYNCPS_TRANSPORT_SOCKET_H_
