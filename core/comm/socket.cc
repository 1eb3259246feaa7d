#include "core/comm/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"

namespace mcc {
namespace comm {
namespace {

int PollMillis(absl::Time deadline) {
  if (deadline == absl::InfiniteFuture()) return -1;
  const absl::Duration left = deadline - absl::Now();
  if (left <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(left) + 1, 1 << 30));
}

std::string ErrnoString(int err) { return strerror(err); }

}  // namespace

int BoundPort(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  if (getsockname(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
    return -1;
  }
  if (addr.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
  }
  if (addr.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port);
  }
  return -1;
}

std::string PeerName(int fd) {
  struct sockaddr_storage addr;
  socklen_t len = sizeof(addr);
  char host[INET6_ADDRSTRLEN] = {0};
  if (getpeername(fd, reinterpret_cast<struct sockaddr*>(&addr), &len) != 0) {
    return "an unknown peer";
  }
  if (addr.ss_family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&addr);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (addr.ss_family == AF_INET6) {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&addr);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in6->sin6_port));
  }
  return "an unknown peer";
}

absl::StatusOr<int> ListenTcp(absl::string_view host, int port,
                              int* bound_port) {
  struct addrinfo hints;
  memset(&hints, 0, sizeof(hints));
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  struct addrinfo* res = nullptr;
  const std::string host_str(host);
  const std::string port_str = std::to_string(port);
  int rc = getaddrinfo(host_str.empty() ? nullptr : host_str.c_str(),
                       port_str.c_str(), &hints, &res);
  if (rc != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot resolve '", host, "' to listen on: ", gai_strerror(rc)));
  }
  std::string last_error = "no address";
  bool in_use = false;
  for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd =
        socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      in_use = in_use || errno == EADDRINUSE;
      last_error = ErrnoString(errno);
      close(fd);
      continue;
    }
    *bound_port = BoundPort(fd);
    freeaddrinfo(res);
    return fd;
  }
  freeaddrinfo(res);
  const std::string message =
      absl::StrCat("cannot listen on ", host, ":", port, ": ", last_error);
  return in_use ? absl::AlreadyExistsError(message)
                : absl::UnavailableError(message);
}

bool EphemeralPortRange(int* low, int* high) {
  std::ifstream in("/proc/sys/net/ipv4/ip_local_port_range");
  return static_cast<bool>(in >> *low >> *high) && *low <= *high;
}

absl::StatusOr<int> ListenOnFreePort(absl::string_view host, int* bound_port) {
  // Prefer a port below the kernel's ephemeral range: a port from inside it
  // can be handed to another process's outgoing connection or port-0
  // listener (gloo's pair listeners) between a check and a later listen.
  int low = 0, high = 0;
  if (EphemeralPortRange(&low, &high) && low > 2048) {
    const int first = std::max(1024, low / 2);
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<int> pick(first, low - 1);
    for (int attempt = 0; attempt < 64; ++attempt) {
      absl::StatusOr<int> fd = ListenTcp(host, pick(rng), bound_port);
      if (fd.ok()) return fd;
    }
  }
  return ListenTcp(host, 0, bound_port);
}

absl::StatusOr<int> FindFreePort() {
  int port = 0;
  absl::StatusOr<int> fd = ListenOnFreePort("127.0.0.1", &port);
  if (!fd.ok()) return fd.status();
  close(*fd);
  return port;
}

absl::StatusOr<int> ConnectTcp(absl::string_view host, int port,
                               absl::Time deadline) {
  const std::string host_str(host);
  const std::string port_str = std::to_string(port);
  std::string last_error;
  absl::Duration backoff = absl::Milliseconds(5);
  while (true) {
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    struct addrinfo* res = nullptr;
    int rc = getaddrinfo(host_str.c_str(), port_str.c_str(), &hints, &res);
    if (rc != 0) {
      last_error = gai_strerror(rc);
    } else {
      for (struct addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
        int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC,
                        ai->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
          int one = 1;
          setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
          freeaddrinfo(res);
          return fd;
        }
        last_error = ErrnoString(errno);
        close(fd);
      }
      freeaddrinfo(res);
    }
    if (absl::Now() + backoff > deadline) break;
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Milliseconds(200));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("cannot connect to ", host, ":", port,
                   " before the timeout: ", last_error));
}

absl::Status SendAll(int fd, const void* data, size_t n, absl::Time deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    struct pollfd pfd = {fd, POLLOUT, 0};
    int rc = poll(&pfd, 1, PollMillis(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return absl::DeadlineExceededError("send timed out");
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(
          absl::StrCat("connection lost: ", ErrnoString(errno)));
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int fd, void* data, size_t n, absl::Time deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    struct pollfd pfd = {fd, POLLIN, 0};
    int rc = poll(&pfd, 1, PollMillis(deadline));
    if (rc < 0 && errno == EINTR) continue;
    if (rc == 0) return absl::DeadlineExceededError("receive timed out");
    ssize_t r = recv(fd, p, n, 0);
    if (r == 0) return absl::UnavailableError("connection closed by peer");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      return absl::UnavailableError(
          absl::StrCat("connection lost: ", ErrnoString(errno)));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
  return absl::OkStatus();
}

}  // namespace comm
}  // namespace mcc
