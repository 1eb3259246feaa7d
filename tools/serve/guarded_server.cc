#include "tools/serve/guarded_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "tools/serve/completions_api.h"

namespace mcc {
namespace serve {
namespace {

// The socket whose request this worker thread is handling.
thread_local int current_socket = -1;

// The peer closed (or reset) its side: poll reports it without reading.
bool PeerGone(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

int PollMillis(absl::Duration d) {
  if (d <= absl::ZeroDuration()) return 0;
  return static_cast<int>(
      std::min<int64_t>(absl::ToInt64Milliseconds(d) + 1, 1000));
}

// httplib runs a task inline: process_and_close_socket only hands the socket
// to the reader, so the accept loop never waits for a thread.
class InlineQueue : public httplib::TaskQueue {
 public:
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override {}
};

// A buffered request for httplib's parser: reads come from the buffer (never
// past this request's end), writes go to the socket within a deadline.
class BufferedStream : public httplib::Stream {
 public:
  BufferedStream(int fd, const std::string& buf, size_t end,
                 absl::Duration write_timeout)
      : fd_(fd), buf_(buf), end_(end), write_timeout_(write_timeout) {}

  bool is_readable() const override { return pos_ < end_; }
  bool is_writable() const override { return !failed_ && !PeerGone(fd_); }
  ssize_t read(char* ptr, size_t size) override {
    const size_t n = std::min(size, end_ - pos_);
    std::memcpy(ptr, buf_.data() + pos_, n);
    pos_ += n;
    return static_cast<ssize_t>(n);
  }
  ssize_t write(const char* ptr, size_t size) override {
    const absl::Time deadline = absl::Now() + write_timeout_;
    size_t sent = 0;
    while (!failed_ && sent < size) {
      const ssize_t n = ::send(fd_, ptr + sent, size - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && (errno == EAGAIN || errno == EINTR)) {
        pollfd p{fd_, POLLOUT, 0};
        const absl::Duration left = deadline - absl::Now();
        if (left <= absl::ZeroDuration() ||
            ::poll(&p, 1, PollMillis(left)) < 0) {
          failed_ = true;
        }
      } else {
        failed_ = true;
      }
    }
    return failed_ ? -1 : static_cast<ssize_t>(size);
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    Address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    Address(::getsockname, ip, port);
  }
  socket_t socket() const override { return fd_; }
  bool failed() const { return failed_; }

 private:
  template <typename F>
  void Address(F get, std::string& ip, int& port) const {
    sockaddr_storage addr{};
    socklen_t len = sizeof(addr);
    ip.clear();
    port = 0;
    if (get(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (addr.ss_family == AF_INET) {
      auto* a = reinterpret_cast<sockaddr_in*>(&addr);
      ::inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
      port = ntohs(a->sin_port);
    } else if (addr.ss_family == AF_INET6) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&addr);
      ::inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
      port = ntohs(a->sin6_port);
    }
    ip = text;
  }

  int fd_;
  const std::string& buf_;
  size_t end_, pos_ = 0;
  absl::Duration write_timeout_;
  bool failed_ = false;
};

std::string Response(int status, absl::string_view reason,
                     const std::string& message) {
  const std::string body = ErrorBody(message, status);
  return absl::StrCat("HTTP/1.1 ", status, " ", reason,
                      "\r\nContent-Type: application/json\r\nContent-Length: ",
                      body.size(), "\r\nConnection: close\r\n\r\n", body);
}

}  // namespace

struct GuardedServer::Connection {
  int fd = -1;
  std::string buf;  // This request's bytes (and any pipelined after them).
  absl::Time deadline;
  bool started = false;   // A byte of this request has arrived.
  bool draining = false;  // Refused: reading and dropping until closed.
  int served = 0;
  // The parse: lines of the head up to `scanned`; then the body's framing.
  size_t scanned = 0, head_end = 0, request_end = 0;
  enum class Framing { kNone, kLength, kChunked } framing = Framing::kNone;
  size_t content_length = 0;
  size_t chunk_pos = 0, body_bytes = 0;
  bool trailer = false;

  void NextRequest() {
    buf.erase(0, request_end);
    started = !buf.empty();
    scanned = head_end = request_end = 0;
    framing = Framing::kNone;
    content_length = chunk_pos = body_bytes = 0;
    trailer = false;
  }
};

GuardedServer::GuardedServer(GuardOptions options)
    : options_(std::move(options)) {
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  PCHECK(wake_fd_ >= 0) << "eventfd";
  new_task_queue = [] { return new InlineQueue; };
  set_payload_max_length(options_.max_body_bytes);
  reader_ = std::thread([this] { ReadLoop(); });
  for (int i = 0; i < options_.workers; ++i) {
    workers_.emplace_back([this] { WorkLoop(); });
  }
}

GuardedServer::~GuardedServer() {
  stop();
  StopGuards();
  ::close(wake_fd_);
}

void GuardedServer::StopGuards() {
  {
    absl::MutexLock lock(&mu_);
    if (stopping_ && !reader_.joinable()) return;
    stopping_ = true;
  }
  Wake();
  if (reader_.joinable()) reader_.join();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  absl::MutexLock lock(&mu_);
  for (auto& c : inbox_) Close(std::move(c));
  for (auto& c : ready_) Close(std::move(c));
  inbox_.clear();
  ready_.clear();
}

void GuardedServer::WidenBacklog() {
  // listen() again on a listening socket sets its backlog (Linux).
  if (::listen(svr_sock_, options_.listen_backlog) != 0) {
    PLOG(WARNING) << "serve: cannot widen the listen backlog";
  }
}

bool GuardedServer::ClientLeft() {
  return current_socket >= 0 && PeerGone(current_socket);
}

void GuardedServer::Wake() {
  const uint64_t one = 1;
  (void)!::write(wake_fd_, &one, sizeof(one));
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  if (connections_.load() >= options_.max_connections) {
    const std::string r =
        Response(503, "Service Unavailable",
                 "the server has too many open connections; retry later");
    (void)!::send(sock, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    ::close(sock);
    return false;
  }
  ::fcntl(sock, F_SETFL, ::fcntl(sock, F_GETFL) | O_NONBLOCK);
  ++connections_;
  auto c = std::make_unique<Connection>();
  c->fd = sock;
  c->deadline = absl::Now() + options_.read_timeout;
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      Close(std::move(c));
      return false;
    }
    inbox_.push_back(std::move(c));
  }
  Wake();
  return true;
}

void GuardedServer::Close(std::unique_ptr<Connection> c) {
  if (c == nullptr) return;
  ::close(c->fd);
  --connections_;
}

bool GuardedServer::Complete(Connection* c, std::string* refusal) {
  auto refuse = [&](int status, absl::string_view reason,
                    const std::string& message) {
    *refusal = Response(status, reason, message);
    return false;
  };
  if (c->head_end == 0) {
    // Empty lines before a request line are ignored (RFC 9112 2.2).
    size_t lead = 0;
    while (c->scanned == 0 && lead < c->buf.size() &&
           (c->buf[lead] == '\r' || c->buf[lead] == '\n')) {
      ++lead;
    }
    c->buf.erase(0, lead);
    while (c->head_end == 0) {
      const size_t nl = c->buf.find('\n', c->scanned);
      if (nl == std::string::npos) break;
      const bool empty = nl == c->scanned ||
                         (nl == c->scanned + 1 && c->buf[c->scanned] == '\r');
      if (empty && c->scanned > 0) c->head_end = nl + 1;
      c->scanned = nl + 1;
    }
    if (c->head_end == 0) {
      if (c->buf.size() > options_.max_head_bytes) {
        return refuse(431, "Request Header Fields Too Large",
                      absl::StrCat("the request line and headers exceed ",
                                   options_.max_head_bytes, " bytes"));
      }
      return false;
    }
    if (c->head_end > options_.max_head_bytes) {
      return refuse(431, "Request Header Fields Too Large",
                    absl::StrCat("the request line and headers exceed ",
                                 options_.max_head_bytes, " bytes"));
    }
    // The headers that frame the body.
    bool has_length = false, expect_continue = false;
    size_t line = c->buf.find('\n') + 1;
    while (line < c->head_end) {
      const size_t start = line;
      const size_t nl = c->buf.find('\n', line);
      absl::string_view h(c->buf.data() + line, nl - line);
      line = nl + 1;
      const size_t colon = h.find(':');
      if (colon == absl::string_view::npos) continue;
      const std::string name = absl::AsciiStrToLower(h.substr(0, colon));
      const std::string value = absl::AsciiStrToLower(
          absl::StripAsciiWhitespace(h.substr(colon + 1)));
      if (name == "content-length") {
        uint64_t n = 0;
        if (value.empty() || value.size() > 19 ||
            value.find_first_not_of("0123456789") != std::string::npos ||
            !absl::SimpleAtoi(value, &n) ||
            (has_length && n != c->content_length)) {
          return refuse(400, "Bad Request", "a bad Content-Length");
        }
        if (n > options_.max_body_bytes) {
          return refuse(413, "Payload Too Large",
                        absl::StrCat("the request body of ", n,
                                     " bytes is larger than the server's "
                                     "limit of ",
                                     options_.max_body_bytes, " bytes"));
        }
        has_length = true;
        c->content_length = n;
      } else if (name == "transfer-encoding") {
        if (value == "chunked") {
          c->framing = Connection::Framing::kChunked;
        } else if (value != "identity") {
          return refuse(501, "Not Implemented",
                        absl::StrCat("Transfer-Encoding ", value,
                                     " is not supported (only chunked)"));
        }
      } else if (name == "expect") {
        // Answered here (the body is read here); renamed so that httplib
        // does not answer it again.
        expect_continue = value == "100-continue";
        c->buf[start] = 'X';
      } else if (name == "content-encoding") {
        // Decompression would grow a small body past the limit in memory.
        if (!value.empty() && value != "identity") {
          return refuse(415, "Unsupported Media Type",
                        absl::StrCat("Content-Encoding ", value,
                                     " is not accepted: send the body "
                                     "uncompressed"));
        }
      }
    }
    if (c->framing == Connection::Framing::kChunked) {
      if (has_length) {
        return refuse(400, "Bad Request",
                      "both Content-Length and Transfer-Encoding given");
      }
      c->chunk_pos = c->head_end;
    } else if (has_length) {
      c->framing = Connection::Framing::kLength;
    }
    const bool body_to_come =
        c->framing == Connection::Framing::kChunked ||
        (has_length && c->buf.size() < c->head_end + c->content_length);
    if (expect_continue && body_to_come) {
      constexpr absl::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
      (void)!::send(c->fd, kContinue.data(), kContinue.size(),
                    MSG_NOSIGNAL | MSG_DONTWAIT);
    }
  }
  switch (c->framing) {
    case Connection::Framing::kNone:
      c->request_end = c->head_end;
      return true;
    case Connection::Framing::kLength:
      c->request_end = c->head_end + c->content_length;
      return c->buf.size() >= c->request_end;
    case Connection::Framing::kChunked:
      break;
  }
  // Chunked: each size is checked against the limit before its data is
  // waited for; framing bytes are bounded too (many 1-byte chunks).
  if (c->buf.size() - c->head_end > 2 * options_.max_body_bytes + 65536) {
    return refuse(413, "Payload Too Large",
                  "the chunked request body is larger than the server's limit");
  }
  while (true) {
    const size_t nl = c->buf.find('\n', c->chunk_pos);
    if (nl == std::string::npos) {
      if (c->buf.size() - c->chunk_pos > 4096) {
        return refuse(400, "Bad Request", "a bad chunk in the request body");
      }
      return false;
    }
    absl::string_view l(c->buf.data() + c->chunk_pos, nl - c->chunk_pos);
    if (c->trailer) {
      c->chunk_pos = nl + 1;
      if (l.empty() || l == "\r") {
        c->request_end = nl + 1;
        return true;
      }
      continue;
    }
    size_t digits = 0;
    uint64_t size = 0;
    while (digits < l.size() && absl::ascii_isxdigit(l[digits])) {
      const char ch = absl::ascii_tolower(l[digits]);
      size = size * 16 + (ch <= '9' ? ch - '0' : ch - 'a' + 10);
      if (++digits > 15) break;
    }
    if (digits == 0 || digits > 15) {
      return refuse(400, "Bad Request", "a bad chunk size in the request body");
    }
    if (size == 0) {
      c->trailer = true;
      c->chunk_pos = nl + 1;
      continue;
    }
    if (c->body_bytes + size > options_.max_body_bytes) {
      return refuse(413, "Payload Too Large",
                    absl::StrCat("the chunked request body is larger than the "
                                 "server's limit of ",
                                 options_.max_body_bytes, " bytes"));
    }
    const size_t end = nl + 1 + size;
    if (c->buf.size() < end + 2) return false;
    if (c->buf.compare(end, 2, "\r\n") != 0) {
      return refuse(400, "Bad Request", "a bad chunk in the request body");
    }
    c->body_bytes += size;
    c->chunk_pos = end + 2;
  }
}

void GuardedServer::ReadLoop() {
  std::map<int, std::unique_ptr<Connection>> conns;
  std::vector<pollfd> fds;
  auto refuse = [&](Connection* c, const std::string& response) {
    (void)!::send(c->fd, response.data(), response.size(),
                  MSG_NOSIGNAL | MSG_DONTWAIT);
    // Read and drop what the client still sends for a moment, so that it
    // reads the answer instead of a reset; then close.
    ::shutdown(c->fd, SHUT_WR);
    c->draining = true;
    c->buf.clear();
    c->buf.shrink_to_fit();
    c->deadline = absl::Now() + absl::Seconds(1);
  };
  // Parses; hands a whole request to the workers. False: no longer ours.
  auto advance = [&](Connection* c) {
    std::string refusal;
    if (Complete(c, &refusal)) {
      absl::MutexLock lock(&mu_);
      ready_.push_back(std::move(conns[c->fd]));
      return false;
    }
    if (!refusal.empty()) refuse(c, refusal);
    return true;
  };
  char chunk[16384];
  while (true) {
    std::vector<std::unique_ptr<Connection>> arrived;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) break;
      arrived.swap(inbox_);
    }
    for (auto& c : arrived) {
      const int fd = c->fd;
      conns[fd] = std::move(c);
      // A kept-alive connection may already hold its next request.
      if (conns[fd]->started && !advance(conns[fd].get())) conns.erase(fd);
    }
    const absl::Time now = absl::Now();
    absl::Duration wait = absl::Seconds(1);
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    for (auto& [fd, c] : conns) {
      fds.push_back(pollfd{fd, POLLIN | POLLRDHUP, 0});
      wait = std::min(wait, c->deadline - now);
    }
    if (::poll(fds.data(), fds.size(), PollMillis(wait)) < 0 &&
        errno != EINTR) {
      PLOG(ERROR) << "serve: poll";
    }
    if (fds[0].revents != 0) {
      uint64_t n;
      (void)!::read(wake_fd_, &n, sizeof(n));
    }
    // Bytes of requests still arriving, all connections together.
    size_t buffered = 0;
    for (const auto& [fd, c] : conns) buffered += c->buf.size();
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto it = conns.find(fds[i].fd);
      Connection* c = it->second.get();
      bool keep = true, parse = false;
      // Up to 256 KiB a turn, so one fast sender does not starve the rest.
      for (int turn = 0; turn < 16 && keep; ++turn) {
        const ssize_t n = ::recv(c->fd, chunk, sizeof(chunk), 0);
        if (n > 0) {
          if (c->draining) continue;
          if (!c->started) {
            c->started = true;
            c->deadline = absl::Now() + options_.read_timeout;
          }
          c->buf.append(chunk, static_cast<size_t>(n));
          parse = true;
          buffered += static_cast<size_t>(n);
          if (c->buf.size() >
              options_.max_head_bytes + 2 * options_.max_body_bytes + 65536) {
            break;  // Complete refuses it.
          }
        } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
          keep = false;  // Closed or reset.
        } else {
          break;
        }
      }
      if (keep && parse && !c->draining) {
        const size_t held = c->buf.size();
        keep = advance(c);
        if (!keep) {
          buffered -= std::min(buffered, held);  // To the workers.
        } else if (buffered > options_.max_buffered_bytes && !c->draining) {
          buffered -= std::min(buffered, held);
          refuse(c, Response(503, "Service Unavailable",
                             "the server is receiving too many requests at "
                             "once; retry later"));
        }
      }
      // Not kept: closed, or (null) handed to the workers.
      if (!keep) {
        if (it->second != nullptr) Close(std::move(it->second));
        conns.erase(it);
      }
    }
    const absl::Time after = absl::Now();
    for (auto it = conns.begin(); it != conns.end();) {
      Connection* c = it->second.get();
      if (after < c->deadline) {
        ++it;
      } else if (c->started && !c->draining) {
        refuse(c, Response(408, "Request Timeout",
                           absl::StrCat(
                               "the request did not arrive within ",
                               absl::FormatDuration(options_.read_timeout))));
        ++it;
      } else {
        Close(std::move(it->second));
        it = conns.erase(it);
      }
    }
  }
  for (auto& [fd, c] : conns) Close(std::move(c));
}

void GuardedServer::WorkLoop() {
  while (true) {
    std::unique_ptr<Connection> c;
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || !ready_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (ready_.empty()) return;  // Stopping.
      c = std::move(ready_.front());
      ready_.pop_front();
    }
    Serve(std::move(c));
  }
}

void GuardedServer::Serve(std::unique_ptr<Connection> c) {
  bool keep = false;
  {
    BufferedStream stream(c->fd, c->buf, c->request_end,
                          options_.write_timeout);
    bool stopping = false;
    {
      absl::MutexLock lock(&mu_);
      stopping = stopping_;
    }
    const bool last =
        ++c->served >= options_.max_requests_per_connection || stopping;
    bool client_closes = false;
    current_socket = c->fd;
    const bool ok = process_request(stream, last, client_closes, nullptr);
    current_socket = -1;
    keep = ok && !last && !client_closes && !stream.failed();
  }
  if (!keep) {
    Close(std::move(c));
    return;
  }
  c->NextRequest();
  c->deadline = absl::Now() +
                (c->started ? options_.read_timeout : options_.idle_timeout);
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) {
      Close(std::move(c));
      return;
    }
    inbox_.push_back(std::move(c));
  }
  Wake();
}

}  // namespace serve
}  // namespace mcc
