#include "core/comm/port_reservation.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "core/comm/socket.h"

namespace mcc {
namespace comm {

absl::StatusOr<PortReservation> PortReservation::Listen(absl::string_view host,
                                                        int port) {
  PortReservation r;
  absl::StatusOr<int> fd = port != 0 ? ListenTcp(host, port, &r.port_)
                                     : ListenOnFreePort(host, &r.port_);
  if (!fd.ok()) return fd.status();
  r.fd_ = *fd;
  return r;
}

PortReservation::PortReservation(PortReservation&& other) noexcept
    : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

PortReservation& PortReservation::operator=(PortReservation&& other) noexcept {
  if (this != &other) {
    Release();
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

PortReservation::~PortReservation() { Release(); }

void PortReservation::HandToChild() const {
  if (fd_ < 0) return;
  fcntl(fd_, F_SETFD, 0);  // Survive the exec (the parent's copy keeps it).
  setenv(kStoreListenFdEnv, std::to_string(fd_).c_str(), 1);
}

void PortReservation::Release() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

int TakeHandedListener(int port) {
  const char* value = std::getenv(kStoreListenFdEnv);
  if (value == nullptr) return -1;
  int fd = -1;
  const bool parsed = absl::SimpleAtoi(value, &fd) && fd >= 0;
  unsetenv(kStoreListenFdEnv);
  if (!parsed) return -1;
  int listening = 0;
  socklen_t len = sizeof(listening);
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 ||
      !listening || BoundPort(fd) != port) {
    // Not ours to use (a stale variable, or another port): leave it be.
    return -1;
  }
  fcntl(fd, F_SETFD, FD_CLOEXEC);  // The process's own children must not.
  return fd;
}

}  // namespace comm
}  // namespace mcc
