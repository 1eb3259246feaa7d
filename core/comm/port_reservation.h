#ifndef CORE_COMM_PORT_RESERVATION_H_
#define CORE_COMM_PORT_RESERVATION_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace comm {

// The environment variable through which a launcher hands rank 0 the socket
// already listening on MASTER_PORT (its file descriptor number).
inline constexpr char kStoreListenFdEnv[] = "MCC_STORE_LISTEN_FD";

// A rendezvous port held from the moment it is chosen until rank 0 serves
// the store on it. Picking a free port, closing it and letting rank 0 bind it
// later leaves a window in which a second job started at the same moment can
// pick the same port; its ranks then reach the first job's store. A launcher
// instead keeps the port listening and passes the socket to rank 0, which
// serves on it (TcpStoreServer::Start adopts it).
class PortReservation {
 public:
  // Listens on host:port; port 0 picks one below the kernel's ephemeral
  // range where possible (see FindFreePort), else the kernel's pick.
  static absl::StatusOr<PortReservation> Listen(absl::string_view host,
                                                int port);
  PortReservation() = default;
  PortReservation(PortReservation&& other) noexcept;
  PortReservation& operator=(PortReservation&& other) noexcept;
  PortReservation(const PortReservation&) = delete;
  PortReservation& operator=(const PortReservation&) = delete;
  ~PortReservation();

  int port() const { return port_; }
  bool held() const { return fd_ >= 0; }

  // In a forked child that will exec rank 0: keeps the socket open across
  // exec and names it in MCC_STORE_LISTEN_FD. Async-signal-safe apart from
  // setenv, as the launchers' children already call setenv.
  void HandToChild() const;
  // Closes the parent's copy (after rank 0 was forked).
  void Release();

 private:
  int fd_ = -1;
  int port_ = 0;
};

// The listening socket a launcher handed this process for host:port, taken
// out of the environment (so that the process's own children do not see
// it), or -1 when there is none or it does not listen on that port.
int TakeHandedListener(int port);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_PORT_RESERVATION_H_
