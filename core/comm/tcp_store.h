#ifndef CORE_COMM_TCP_STORE_H_
#define CORE_COMM_TCP_STORE_H_

#include <atomic>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "core/comm/store.h"
#include "core/comm/store_service.h"

namespace mcc {
namespace comm {

// The server side of the rendezvous store: an in-memory key-value map served
// over TCP, one thread per client connection up to limits.max_connections
// (more are refused with a logged warning; finished threads are joined as
// they end). Rank 0 hosts it at MASTER_ADDR:MASTER_PORT. Requests are
// handled by StoreService (store_service.h), which checks each.
//
// With a secret, a connection must prove it holds the secret (a
// challenge-response in its hello) before any other request, within
// limits.hello_deadline of connecting. Without one the store serves anyone
// who reaches it, as a single-user run may want; it logs that once.
//
// Clients may announce their rank; when such a connection drops without a
// goodbye (the process died), the rank is recorded as lost, so the other
// ranks can name it in their errors. The announcement carries the client's
// job; a client of another job is refused (two jobs given one port).
class TcpStoreServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    // 0 picks a free port (see port()). When a launcher handed this process
    // a socket already listening on that port (PortReservation), the server
    // serves on it instead of binding again.
    int port = 0;
    // The job whose ranks may announce themselves ("" for any announcing "").
    std::string job_id;
    // The job's shared secret (MCC_JOB_SECRET); "" for none.
    std::string secret;
    StoreLimits limits;
  };
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(
      const Options& options);
  ~TcpStoreServer();

  int port() const { return port_; }
  // Connections being served now.
  int connections();

 private:
  TcpStoreServer() = default;
  void AcceptLoop();
  void Serve(int fd, const std::string& peer);
  // Joins the threads of connections that ended.
  void ReapFinished();
  // Refuses a connection past the limit (or whose thread did not start).
  void Refuse(int fd, const std::string& peer, const std::string& why);

  int listen_fd_ = -1;
  int port_ = 0;
  std::unique_ptr<StoreService> service_;
  std::atomic<bool> stop_{false};
  std::thread accept_thread_;

  std::mutex mu_;  // Guards the connection bookkeeping below.
  std::set<int> client_fds_;
  std::map<std::thread::id, std::thread> client_threads_;
  std::vector<std::thread::id> finished_;
  int64_t refused_ = 0;
};

// A client of TcpStoreServer. Calls are serialised per client object; use
// one client per thread that blocks in Wait/Get for long.
class TcpStore : public Store {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;
    // Whether this process hosts the server (rank 0 does).
    bool is_server = false;
    // The rank this connection reports for liveness tracking; -1 for none.
    int rank = -1;
    // The job this rank belongs to (DistEnv::job_id): the server refuses a
    // rank of another job. Checked where rank >= 0 or a secret is set.
    std::string job_id;
    // The job's shared secret (DistEnv::secret): every connection proves it
    // to the server in its hello, and a hosted server requires that proof.
    // "" for none (an unauthenticated store).
    std::string secret;
    // The hosted server's limits (is_server only).
    StoreLimits limits;
    absl::Duration timeout = absl::Minutes(5);
  };

  // Starts the server when options.is_server, then connects (retrying until
  // the timeout while the server comes up).
  static absl::StatusOr<std::shared_ptr<TcpStore>> Connect(
      const Options& options);
  ~TcpStore() override;

  // A second connection to the same server (for another thread), without
  // the liveness announcement (but authenticated like the first) and sharing
  // the hosted server, if any.
  absl::StatusOr<std::shared_ptr<TcpStore>> Clone() const;

  absl::Duration default_timeout() const override { return options_.timeout; }
  absl::Status Set(absl::string_view key, absl::string_view value) override;
  using Store::Get;
  using Store::Wait;
  absl::StatusOr<std::string> Get(absl::string_view key,
                                  absl::Duration timeout) override;
  absl::Status Wait(absl::Span<const std::string> keys,
                    absl::Duration timeout) override;
  absl::StatusOr<int64_t> Add(absl::string_view key, int64_t delta) override;
  absl::StatusOr<bool> Check(absl::Span<const std::string> keys) override;
  absl::Status Delete(absl::string_view key) override;
  absl::StatusOr<std::vector<int>> LostRanks() override;

  const Options& options() const { return options_; }
  // The port the server listens on (the chosen one when options.port was 0).
  int port() const { return options_.port; }

 private:
  TcpStore() = default;
  // Sends one request and reads the reply; `wait` is how long the server
  // may take to answer (blocking Get/Wait), `slack` how much longer a
  // loaded server may take. A reply that does not come leaves the
  // connection out of step: every later call fails at once with the same
  // error (the store's host is gone or stopped).
  absl::StatusOr<std::vector<std::string>> Call(
      char op, const std::vector<std::string>& args, absl::Duration wait,
      absl::Duration slack = absl::Seconds(10));

  Options options_;
  std::shared_ptr<TcpStoreServer> server_;
  std::mutex mu_;
  int fd_ = -1;
  absl::Status broken_;  // Set once a reply failed to arrive.
};

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_TCP_STORE_H_
