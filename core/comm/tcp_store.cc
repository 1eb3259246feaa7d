#include "core/comm/tcp_store.h"

#include <errno.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <system_error>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/comm/port_reservation.h"
#include "core/comm/socket.h"
#include "core/comm/store_auth.h"
#include "core/comm/store_message.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace comm {
namespace {

// Wire format and operations: store_message.h. Request: op (1 byte), then
// the arguments. Reply: code (1 byte), then arguments as in a request.

absl::Status WriteMessage(int fd, char head,
                          const std::vector<std::string>& args,
                          absl::Time deadline) {
  const std::string buf = EncodeStoreMessage(head, args);
  return SendAll(fd, buf.data(), buf.size(), deadline);
}

absl::Status ReadMessage(int fd, char* head, std::vector<std::string>* args,
                         absl::Time deadline) {
  return ReadStoreMessage(
      [&](void* data, size_t n) { return RecvAll(fd, data, n, deadline); },
      head, args);
}

std::string ToMillisString(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "-1";
  return std::to_string(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const Options& options) {
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer);
  const int handed = options.port != 0 ? TakeHandedListener(options.port) : -1;
  if (handed >= 0) {
    server->listen_fd_ = handed;
    server->port_ = options.port;
  } else {
    MCC_ASSIGN_OR_RETURN(server->listen_fd_,
                         ListenTcp(options.host, options.port, &server->port_));
  }
  server->service_ = std::make_unique<StoreService>(
      options.job_id, options.secret, options.limits, server->port_);
  if (options.secret.empty()) {
    static std::once_flag once;
    std::call_once(once, [&] {
      LOG(WARNING) << "rendezvous store on port " << server->port_
                   << " is unauthenticated: anyone who can reach it can read "
                      "and write its keys (gloo's peer addresses among "
                      "them). Set MCC_JOB_SECRET or MCC_JOB_SECRET_FILE "
                      "(tools/launch does) to require the job's secret";
    });
  }
  try {
    server->accept_thread_ =
        std::thread([s = server.get()] { s->AcceptLoop(); });
  } catch (const std::system_error& e) {
    close(server->listen_fd_);
    server->listen_fd_ = -1;
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot start the rendezvous store's thread: ", e.what()));
  }
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  if (service_ != nullptr) service_->Stop();
  std::map<std::thread::id, std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : client_fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(client_threads_);
  }
  for (auto& kv : threads) kv.second.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

int TcpStoreServer::connections() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(client_threads_.size() - finished_.size());
}

void TcpStoreServer::ReapFinished() {
  std::vector<std::thread> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const std::thread::id& id : finished_) {
      auto it = client_threads_.find(id);
      if (it == client_threads_.end()) continue;
      done.push_back(std::move(it->second));
      client_threads_.erase(it);
    }
    finished_.clear();
  }
  // Each has left Serve: the joins are immediate.
  for (std::thread& t : done) t.join();
}

void TcpStoreServer::Refuse(int fd, const std::string& peer,
                            const std::string& why) {
  const std::string message = absl::StrCat("rendezvous store on port ", port_,
                                           ": refusing ", peer, ": ", why);
  int64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = ++refused_;
  }
  if (n <= 20 || n % 1000 == 0) {
    LOG(WARNING) << message << " (" << n << " refused so far)";
  }
  // The client's first request reads this as its reply. A short deadline:
  // the accept loop must not wait on a peer that does not read.
  WriteMessage(fd, kStoreError, {message},
               absl::Now() + absl::Milliseconds(100))
      .IgnoreError();
  close(fd);
}

void TcpStoreServer::AcceptLoop() {
  while (!stop_) {
    ReapFinished();
    struct pollfd pfd = {listen_fd_, POLLIN, 0};
    int rc = poll(&pfd, 1, 50);
    if (rc <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      // Out of descriptors, for example: wait a little rather than spin.
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS ||
          errno == ENOMEM) {
        LOG_EVERY_N(WARNING, 100) << "rendezvous store on port " << port_
                                  << ": accept failed: " << strerror(errno);
        absl::SleepFor(absl::Milliseconds(10));
      }
      continue;
    }
    const std::string peer = PeerName(fd);
    std::unique_lock<std::mutex> lock(mu_);
    if (stop_) {
      close(fd);
      break;
    }
    const int active =
        static_cast<int>(client_threads_.size() - finished_.size());
    if (active >= service_->limits().max_connections) {
      lock.unlock();
      Refuse(fd, peer,
             absl::StrCat("it already serves ", active,
                          " connections, its limit "
                          "(StoreLimits::max_connections)"));
      continue;
    }
    client_fds_.insert(fd);
    try {
      std::thread t([this, fd, peer] { Serve(fd, peer); });
      const std::thread::id id = t.get_id();
      client_threads_.emplace(id, std::move(t));
    } catch (const std::system_error& e) {
      client_fds_.erase(fd);
      lock.unlock();
      Refuse(fd, peer, absl::StrCat("cannot start a thread: ", e.what()));
    }
  }
}

void TcpStoreServer::Serve(int fd, const std::string& peer) {
  StoreSession session;
  session.peer = peer;
  const StoreLimits& limits = service_->limits();
  const absl::Time connected = absl::Now();
  while (!stop_) {
    // An authorized client may stay quiet between requests for as long as
    // it likes; one yet to prove the secret has hello_deadline in all.
    // Once a request has begun, its rest has message_deadline.
    const bool authorized = service_->Authorized(session);
    const absl::Time first_deadline =
        authorized ? absl::InfiniteFuture() : connected + limits.hello_deadline;
    bool first = true;     // Nothing of this request read yet.
    bool started = false;  // Its first byte arrived.
    absl::Time rest_deadline = absl::InfiniteFuture();
    auto read = [&](void* data, size_t n) -> absl::Status {
      if (first) {
        first = false;
        MCC_RETURN_IF_ERROR(RecvAll(fd, data, 1, first_deadline));
        started = true;
        rest_deadline = absl::Now() + limits.message_deadline;
        if (n == 1) return absl::OkStatus();
        return RecvAll(fd, static_cast<char*>(data) + 1, n - 1, rest_deadline);
      }
      return RecvAll(fd, data, n, rest_deadline);
    };
    char op = 0;
    std::vector<std::string> args;
    const absl::Status s = ReadStoreMessage(
        read, &op, &args,
        authorized ? UINT64_MAX : limits.max_unauthenticated_message_bytes);
    if (!s.ok()) {
      if (s.code() != absl::StatusCode::kUnavailable || started) {
        // Not a plain close between requests: a stalled or bad client.
        LOG(WARNING)
            << "rendezvous store on port " << port_
            << ": dropping the connection from " << peer
            << (session.rank >= 0 ? absl::StrCat(" (rank ", session.rank, ")")
                                  : std::string())
            << (!started ? std::string(": ")
                         : absl::StrCat(" during a request '",
                                        std::string(1, op), "': "))
            << (s.code() == absl::StatusCode::kDeadlineExceeded
                    ? (!started
                           ? absl::StrCat(
                                 "no hello within ",
                                 absl::FormatDuration(limits.hello_deadline))
                           : absl::StrCat(
                                 "the request did not arrive within ",
                                 absl::FormatDuration(limits.message_deadline)))
                    : std::string(s.message()));
      }
      break;
    }
    StoreReply reply = service_->Handle(&session, op, args);
    if (!WriteMessage(fd, reply.code, reply.args,
                      absl::Now() + limits.message_deadline)
             .ok() ||
        reply.close) {
      break;
    }
  }
  service_->EndSession(session);
  std::lock_guard<std::mutex> lock(mu_);
  client_fds_.erase(fd);
  close(fd);
  finished_.push_back(std::this_thread::get_id());
}

absl::StatusOr<std::shared_ptr<TcpStore>> TcpStore::Connect(
    const Options& options) {
  std::shared_ptr<TcpStore> store(new TcpStore);
  store->options_ = options;
  if (options.is_server) {
    TcpStoreServer::Options server_options;
    server_options.host = options.host;
    server_options.port = options.port;
    server_options.job_id = options.job_id;
    server_options.secret = options.secret;
    server_options.limits = options.limits;
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::Start(server_options);
    if (!server.ok()) {
      return absl::Status(
          server.status().code(),
          absl::StrCat("rank ", options.rank,
                       " cannot host the rendezvous store (MASTER_ADDR:"
                       "MASTER_PORT = ",
                       options.host, ":", options.port,
                       "): ", server.status().message()));
    }
    store->server_ = std::move(*server);
    store->options_.port = store->server_->port();
  }
  absl::StatusOr<int> fd =
      ConnectTcp(store->options_.host, store->options_.port,
                 absl::Now() + options.timeout);
  if (!fd.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rank ", options.rank, ": rendezvous store at ", options.host, ":",
        store->options_.port, " (hosted by rank 0) not reachable within ",
        absl::FormatDuration(options.timeout), ": ", fd.status().message()));
  }
  store->fd_ = *fd;
  if (!options.secret.empty()) {
    // Challenge-response: the MAC of the server's nonce, never the secret.
    MCC_ASSIGN_OR_RETURN(
        std::vector<std::string> nonce,
        store->Call(kStoreChallenge, {}, absl::ZeroDuration()));
    if (nonce.size() != 1 || nonce[0].size() != kStoreNonceBytes) {
      return absl::DataLossError(absl::StrCat(
          "rank ", options.rank, ": the rendezvous store at ", options.host,
          ":", store->options_.port, " sent a malformed challenge"));
    }
    MCC_RETURN_IF_ERROR(
        store
            ->Call(kStoreHello,
                   {std::to_string(options.rank), options.job_id,
                    StoreHelloMac(options.secret, nonce[0], options.job_id,
                                  options.rank)},
                   absl::ZeroDuration())
            .status());
  } else if (options.rank >= 0) {
    std::vector<std::string> hello = {std::to_string(options.rank)};
    if (!options.job_id.empty()) hello.push_back(options.job_id);
    MCC_RETURN_IF_ERROR(
        store->Call(kStoreHello, hello, absl::ZeroDuration()).status());
  }
  return store;
}

absl::StatusOr<std::shared_ptr<TcpStore>> TcpStore::Clone() const {
  Options options = options_;
  options.is_server = false;
  options.rank = -1;
  MCC_ASSIGN_OR_RETURN(std::shared_ptr<TcpStore> clone, Connect(options));
  clone->server_ = server_;
  return clone;
}

TcpStore::~TcpStore() {
  if (fd_ >= 0) {
    if (options_.rank >= 0) {
      // A courtesy: a stopped host must not hold a failing rank's exit.
      Call(kStoreBye, {}, absl::ZeroDuration(), absl::Seconds(1)).IgnoreError();
    }
    close(fd_);
  }
  server_.reset();
}

absl::StatusOr<std::vector<std::string>> TcpStore::Call(
    char op, const std::vector<std::string>& args, absl::Duration wait,
    absl::Duration slack) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!broken_.ok()) return broken_;
  const absl::Time deadline = wait == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + wait + slack;
  auto lost = [&](const absl::Status& s) {
    return absl::UnavailableError(absl::StrCat(
        "lost the rendezvous store at ", options_.host, ":", options_.port,
        " (hosted by rank 0; rank 0 may have exited or died): ", s.message()));
  };
  absl::Status s = WriteMessage(fd_, op, args, deadline);
  // A server that refused the connection may have written its reason and
  // closed before the request went out: read the reason all the same.
  char code = 0;
  std::vector<std::string> reply;
  const absl::Status read = ReadMessage(fd_, &code, &reply, deadline);
  if (!read.ok()) {
    broken_ = lost(s.ok() ? read : s);
    return broken_;
  }
  if (code == kStoreTimeout) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous store: timed out after ", absl::FormatDuration(wait),
        " waiting for key(s) ", absl::StrJoin(reply, ", ")));
  }
  if (code == kStoreDenied) {
    return absl::PermissionDeniedError(absl::StrJoin(reply, "; "));
  }
  if (code != kStoreOk) {
    return absl::InternalError(
        absl::StrCat("rendezvous store error: ", absl::StrJoin(reply, "; ")));
  }
  return reply;
}

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  return Call(kStoreSet, {std::string(key), std::string(value)},
              absl::ZeroDuration())
      .status();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key,
                                          absl::Duration timeout) {
  MCC_ASSIGN_OR_RETURN(
      std::vector<std::string> reply,
      Call(kStoreGet, {ToMillisString(timeout), std::string(key)}, timeout));
  if (reply.size() != 1) return absl::DataLossError("store: bad Get reply");
  return std::move(reply[0]);
}

absl::Status TcpStore::Wait(absl::Span<const std::string> keys,
                            absl::Duration timeout) {
  std::vector<std::string> args = {ToMillisString(timeout)};
  args.insert(args.end(), keys.begin(), keys.end());
  return Call(kStoreWait, args, timeout).status();
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  MCC_ASSIGN_OR_RETURN(
      std::vector<std::string> reply,
      Call(kStoreAdd, {std::string(key), std::to_string(delta)},
           absl::ZeroDuration()));
  int64_t value = 0;
  if (reply.size() != 1 || !absl::SimpleAtoi(reply[0], &value)) {
    return absl::DataLossError("store: bad Add reply");
  }
  return value;
}

absl::StatusOr<bool> TcpStore::Check(absl::Span<const std::string> keys) {
  MCC_ASSIGN_OR_RETURN(
      std::vector<std::string> reply,
      Call(kStoreCheck, std::vector<std::string>(keys.begin(), keys.end()),
           absl::ZeroDuration()));
  return reply.size() == 1 && reply[0] == "1";
}

absl::Status TcpStore::Delete(absl::string_view key) {
  return Call(kStoreDelete, {std::string(key)}, absl::ZeroDuration()).status();
}

absl::StatusOr<std::vector<int>> TcpStore::LostRanks() {
  // Asked after a collective failed: a host that does not answer within
  // 2 s is stopped or gone, and the caller names it, rather than adding 10
  // s to every failure while rank 0 hangs.
  MCC_ASSIGN_OR_RETURN(
      std::vector<std::string> reply,
      Call(kStoreLost, {}, absl::ZeroDuration(), absl::Seconds(2)));
  std::vector<int> ranks;
  for (const std::string& r : reply) {
    int v = 0;
    if (absl::SimpleAtoi(r, &v)) ranks.push_back(v);
  }
  return ranks;
}

}  // namespace comm
}  // namespace mcc
