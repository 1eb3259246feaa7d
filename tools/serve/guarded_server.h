#ifndef TOOLS_SERVE_GUARDED_SERVER_H_
#define TOOLS_SERVE_GUARDED_SERVER_H_

// An httplib::Server whose connections cannot hold its threads hostage.
//
// cpp-httplib gives each connection a pool thread for its whole life, and
// that thread waits in recv for the request's head and body: a few hundred
// clients that send a header line every couple of seconds hold every thread
// and nothing else is served. Here one reader thread (poll) receives every
// request, head and body, with a deadline, a head-size limit and a body limit
// checked as bytes arrive (Content-Length or chunked framing; compressed
// bodies are refused), and only a complete request goes to a worker thread,
// which runs httplib's routing and handlers on the buffered bytes. Idle
// keep-alive connections go back to the reader. So slow or hostile clients
// cost a buffer each, bounded in all by max_buffered_bytes, not a thread.

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "httplib.h"

namespace mcc {
namespace serve {

struct GuardOptions {
  // Body bytes after any transfer decoding; more is refused (413) as soon as
  // the Content-Length or a chunk size says so.
  size_t max_body_bytes = 1 << 20;
  size_t max_head_bytes = 64 << 10;  // Request line and headers (431).
  // A request's head and body must arrive within this of its first byte
  // (408), and a kept-alive connection must start its next request within
  // idle_timeout (closed).
  absl::Duration read_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(5);
  absl::Duration write_timeout = absl::Seconds(10);
  int max_connections = 1024;  // Open at once; more are refused (503).
  // Bytes of requests still arriving, all connections together: past it
  // the connection that grew is refused (503), so that slow senders of large
  // bodies cannot hold max_connections x max_body_bytes.
  size_t max_buffered_bytes = size_t{256} << 20;
  int workers = 128;  // Complete requests handled at once.
  int max_requests_per_connection = 1000;
  // httplib listens with a backlog of 5: a burst of connections overflows
  // it and each dropped SYN costs its client a 1 s (then 3 s) retry.
  int listen_backlog = 1024;
};

class GuardedServer : public httplib::Server {
 public:
  explicit GuardedServer(GuardOptions options);
  ~GuardedServer() override;

  // After bind_to_port / bind_to_any_port: widens the listen backlog.
  void WidenBacklog();

  // Stops the reader and the workers (after their current request); call
  // after stop() has ended listen_after_bind().
  void StopGuards();

  // Inside a handler: whether the client of the request on this thread has
  // closed its connection (false outside a handler).
  static bool ClientLeft();

  int open_connections() const { return connections_.load(); }

 private:
  struct Connection;
  bool process_and_close_socket(socket_t sock) override;
  void ReadLoop();
  void WorkLoop();
  // Reads what has arrived; true when the connection stays in the reader.
  bool OnReadable(Connection* c);
  // Parses what is buffered: true when a whole request is buffered; sets
  // *refusal (an HTTP response) when the request is refused.
  bool Complete(Connection* c, std::string* refusal);
  void Serve(std::unique_ptr<Connection> c);
  void Close(std::unique_ptr<Connection> c);
  void Wake();

  const GuardOptions options_;
  std::atomic<int> connections_{0};
  int wake_fd_ = -1;  // eventfd: new connections, returned ones, stop.

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // To the reader: accepted or kept-alive connections.
  std::vector<std::unique_ptr<Connection>> inbox_ ABSL_GUARDED_BY(mu_);
  // To the workers: connections holding a whole request.
  std::deque<std::unique_ptr<Connection>> ready_ ABSL_GUARDED_BY(mu_);

  std::thread reader_;
  std::vector<std::thread> workers_;
};

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_GUARDED_SERVER_H_
