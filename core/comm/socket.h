#ifndef CORE_COMM_SOCKET_H_
#define CORE_COMM_SOCKET_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace mcc {
namespace comm {

// Small blocking-TCP helpers for the store and the launcher.

// The local port a socket is bound to, or -1.
int BoundPort(int fd);
// The address and port of a connected socket's peer ("10.0.0.2:41234",
// "[::1]:41234"), or "an unknown peer".
std::string PeerName(int fd);
// Listens on host:port (port 0: the kernel picks one). Returns the socket
// and writes the bound port to *bound_port. A port in use is AlreadyExists;
// other failures (an address not of this machine) are Unavailable.
absl::StatusOr<int> ListenTcp(absl::string_view host, int port,
                              int* bound_port);
// The kernel's ephemeral port range (ip_local_port_range): the ports it
// hands to port-0 binds and outgoing connections. False when unreadable.
bool EphemeralPortRange(int* low, int* high);
// Listens on a free port of host, picked at random below the kernel's
// ephemeral range where possible (so that no outgoing connection takes it),
// else the kernel's pick for port 0.
absl::StatusOr<int> ListenOnFreePort(absl::string_view host, int* bound_port);
// A port that was free a moment ago (ListenOnFreePort, closed again). Two
// callers at the same moment can get the same port: a launcher should hold
// it instead (PortReservation).
absl::StatusOr<int> FindFreePort();
// Connects to host:port, retrying until the deadline (the server may not be
// up yet).
absl::StatusOr<int> ConnectTcp(absl::string_view host, int port,
                               absl::Time deadline);
// Writes or reads exactly n bytes before the deadline. A closed connection
// or the deadline gives an error (Unavailable / DeadlineExceeded).
absl::Status SendAll(int fd, const void* data, size_t n, absl::Time deadline);
absl::Status RecvAll(int fd, void* data, size_t n, absl::Time deadline);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_SOCKET_H_
