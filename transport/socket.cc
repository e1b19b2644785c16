#include "transport/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace asyncps {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Waits for `events` on any of `fds` until `deadline`; the index of one
// that is ready (or has an error or hang-up for the next call to report).
absl::StatusOr<size_t> WaitAny(absl::Span<const int> fds, short events,
                               absl::Time deadline) {
  absl::InlinedVector<pollfd, 4> p;  // No allocation for a shard or few.
  for (int fd : fds) p.push_back(pollfd{fd, events, 0});
  while (true) {
    int timeout_ms = -1;
    if (deadline != absl::InfiniteFuture()) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) {
        return absl::DeadlineExceededError("deadline passed on the socket");
      }
      // Rounded up, so a short wait does not spin at 0 ms.
      timeout_ms = static_cast<int>(
          std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
    }
    const int n = poll(p.data(), p.size(), timeout_ms);
    if (n < 0 && errno != EINTR) return Errno("poll");
    for (size_t k = 0; n > 0 && k < p.size(); ++k) {
      if (p[k].revents != 0) return k;
    }
  }
}

absl::Status WaitFor(int fd, short events, absl::Time deadline) {
  return WaitAny({fd}, events, deadline).status();
}

// getaddrinfo for TCP over IPv4 or IPv6.
absl::StatusOr<addrinfo*> Resolve(const std::string& host, int port,
                                  bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  const char* node =
      (passive && (host.empty() || host == "0.0.0.0")) ? nullptr : host.c_str();
  const int rc = getaddrinfo(node, service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot resolve '", host, "': ", gai_strerror(rc)));
  }
  return result;
}

}  // namespace

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    Close();
    fd_ = other.Release();
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::StatusOr<Socket> ListenTcp(const std::string& host, int port,
                                 int* bound_port) {
  auto resolved = Resolve(host, port, /*passive=*/true);
  if (!resolved.ok()) return resolved.status();
  // Prefer IPv4 for the wildcard, as gRPC's "0.0.0.0" does.
  addrinfo* chosen = *resolved;
  for (addrinfo* a = *resolved; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      chosen = a;
      break;
    }
  }
  Socket s(socket(chosen->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) {
    freeaddrinfo(*resolved);
    return Errno("socket");
  }
  int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  const int rc = bind(s.fd(), chosen->ai_addr, chosen->ai_addrlen);
  freeaddrinfo(*resolved);
  if (rc != 0) return Errno(absl::StrCat("bind ", host, ":", port));
  if (listen(s.fd(), 128) != 0) return Errno("listen");
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  *bound_port = ntohs(addr.ss_family == AF_INET6
                          ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                          : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  return s;
}

std::string PeerHost(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return "";
  }
  char text[INET6_ADDRSTRLEN] = "";
  const void* raw = nullptr;
  if (address.ss_family == AF_INET) {
    raw = &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr;
  } else if (address.ss_family == AF_INET6) {
    raw = &reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
  } else {
    return "";
  }
  if (inet_ntop(address.ss_family, raw, text, sizeof(text)) == nullptr) {
    return "";
  }
  return text;
}

absl::StatusOr<Socket> AcceptTcp(int listener) {
  while (true) {
    pollfd p{listener, POLLIN, 0};
    const int n = poll(&p, 1, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return Errno("poll");
    if (p.revents & (POLLHUP | POLLERR | POLLNVAL)) {
      return absl::UnavailableError("listener shut down");
    }
    const int fd =
        accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      SetNoDelay(fd);
      return Socket(fd);
    }
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
    if (errno == EINVAL) return absl::UnavailableError("listener shut down");
    if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
        errno == ENOMEM) {
      return absl::ResourceExhaustedError(
          absl::StrCat("accept: ", std::strerror(errno)));
    }
    return Errno("accept");
  }
}

namespace {

// ConnectTcp's work; `*refused` (if given) tells whether every address
// refused the connection (ECONNREFUSED) when none was made.
absl::StatusOr<Socket> Connect(const std::string& host, int port,
                               absl::Time deadline, bool* refused) {
  if (refused != nullptr) *refused = false;
  auto resolved = Resolve(host, port, /*passive=*/false);
  if (!resolved.ok()) return resolved.status();
  absl::Status last = absl::UnavailableError("no address");
  bool all_refused = true;
  for (addrinfo* a = *resolved; a != nullptr; a = a->ai_next) {
    Socket s(
        socket(a->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!s.valid()) {
      last = Errno("socket");
      all_refused = false;
      continue;
    }
    int error = 0;
    if (connect(s.fd(), a->ai_addr, a->ai_addrlen) != 0) error = errno;
    if (error == EINPROGRESS) {
      last = WaitFor(s.fd(), POLLOUT, deadline);
      if (!last.ok()) {
        all_refused = false;
        continue;
      }
      socklen_t len = sizeof(error);
      getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, &error, &len);
    }
    if (error != 0) {
      errno = error;
      last = Errno(absl::StrCat("connect to ", host, ":", port));
      all_refused = all_refused && error == ECONNREFUSED;
      continue;
    }
    SetNoDelay(s.fd());
    freeaddrinfo(*resolved);
    return s;
  }
  freeaddrinfo(*resolved);
  if (refused != nullptr) *refused = all_refused;
  return last;
}

}  // namespace

absl::StatusOr<Socket> ConnectTcp(const std::string& host, int port,
                                  absl::Time deadline) {
  return Connect(host, port, deadline, nullptr);
}

absl::StatusOr<bool> RefusesConnections(const std::string& host, int port,
                                        absl::Time deadline) {
  bool refused = false;
  absl::StatusOr<Socket> s = Connect(host, port, deadline, &refused);
  if (s.ok()) return false;
  if (refused) return true;
  return s.status();
}

absl::Status ReadFull(int fd, char* p, size_t n, absl::Time deadline) {
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0) return absl::UnavailableError("connection closed by the peer");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("recv");
    absl::Status ready = WaitFor(fd, POLLIN, deadline);
    if (!ready.ok()) return ready;
  }
  return absl::OkStatus();
}

absl::Status WriteFull(int fd, absl::Span<const iovec> parts,
                       absl::Time deadline) {
  std::vector<iovec> left(parts.begin(), parts.end());
  size_t first = 0;
  while (first < left.size()) {
    if (left[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = &left[first];
    msg.msg_iovlen = std::min<size_t>(left.size() - first, IOV_MAX);
    const ssize_t w = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Errno("send");
      absl::Status ready = WaitFor(fd, POLLOUT, deadline);
      if (!ready.ok()) return ready;
      continue;
    }
    size_t sent = static_cast<size_t>(w);
    while (sent > 0) {
      const size_t take = std::min(sent, left[first].iov_len);
      left[first].iov_base = static_cast<char*>(left[first].iov_base) + take;
      left[first].iov_len -= take;
      sent -= take;
      if (left[first].iov_len == 0) ++first;
    }
  }
  return absl::OkStatus();
}

absl::Status WaitReadable(int fd, absl::Time deadline) {
  return WaitFor(fd, POLLIN, deadline);
}

absl::StatusOr<size_t> WaitAnyReadable(absl::Span<const int> fds,
                                       absl::Time deadline) {
  return WaitAny(fds, POLLIN, deadline);
}

absl::Status WaitWritable(int fd, absl::Time deadline) {
  return WaitFor(fd, POLLOUT, deadline);
}

bool PeerClosed(int fd) {
  char c;
  const ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (r == 0) return true;
  return r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

void LingerClose(int fd, absl::Time deadline) {
  shutdown(fd, SHUT_WR);
  char buf[16 << 10];
  while (true) {
    const ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r > 0 || (r < 0 && errno == EINTR)) continue;
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return;
    if (!WaitFor(fd, POLLIN, deadline).ok()) return;
  }
}

void ShutdownSocket(int fd) { shutdown(fd, SHUT_RDWR); }

}  // namespace asyncps
