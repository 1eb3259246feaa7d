#include "core/comm/tcp_store.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/comm/port_reservation.h"
#include "core/comm/socket.h"
#include "core/comm/store_message.h"
#include "core/status_macros.h"
#include "glog/logging.h"

namespace mcc {
namespace comm {
namespace {

// Wire format (store_message.h). Request: op (1 byte), then the arguments.
// Reply: code (1 byte), then arguments as in a request.
enum Op : char {
  kSet = 'S',
  kGet = 'G',
  kWait = 'W',
  kAdd = 'A',
  kCheck = 'C',
  kDelete = 'D',
  kHello = 'H',
  kBye = 'B',
  kLost = 'L',
};
enum Code : char { kOk = 0, kTimeout = 1, kError = 2 };

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

absl::Duration FromMillisString(const std::string& s) {
  int64_t ms = 0;
  if (!absl::SimpleAtoi(s, &ms)) return absl::ZeroDuration();
  return ms < 0 ? absl::InfiniteDuration() : absl::Milliseconds(ms);
}

std::string ToMillisString(absl::Duration d) {
  if (d == absl::InfiniteDuration()) return "-1";
  return std::to_string(absl::ToInt64Milliseconds(d));
}

}  // namespace

absl::StatusOr<std::unique_ptr<TcpStoreServer>> TcpStoreServer::Start(
    const std::string& host, int port, const std::string& job_id) {
  std::unique_ptr<TcpStoreServer> server(new TcpStoreServer);
  server->job_id_ = job_id;
  const int handed = port != 0 ? TakeHandedListener(port) : -1;
  if (handed >= 0) {
    server->listen_fd_ = handed;
    server->port_ = port;
  } else {
    MCC_ASSIGN_OR_RETURN(server->listen_fd_,
                         ListenTcp(host, port, &server->port_));
  }
  server->accept_thread_ = std::thread([s = server.get()] { s->AcceptLoop(); });
  return server;
}

TcpStoreServer::~TcpStoreServer() {
  stop_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int fd : client_fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(client_threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
  if (listen_fd_ >= 0) close(listen_fd_);
}

void TcpStoreServer::AcceptLoop() {
  while (!stop_) {
    struct pollfd pfd = {listen_fd_, POLLIN, 0};
    int rc = poll(&pfd, 1, 50);
    if (rc <= 0) continue;
    int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) {
      close(fd);
      break;
    }
    client_fds_.insert(fd);
    client_threads_.emplace_back([this, fd] { Serve(fd); });
  }
}

void TcpStoreServer::Serve(int fd) {
  int rank = -1;
  bool said_bye = false;
  while (!stop_) {
    char op = 0;
    std::vector<std::string> args;
    if (!ReadMessage(fd, &op, &args, absl::InfiniteFuture()).ok()) break;
    std::vector<std::string> reply;
    char code = kOk;
    {
      std::unique_lock<std::mutex> lock(mu_);
      switch (op) {
        case kSet:
          if (args.size() != 2) {
            code = kError;
            break;
          }
          data_[args[0]] = args[1];
          cv_.notify_all();
          break;
        case kGet:
        case kWait: {
          if (args.empty()) {
            code = kError;
            break;
          }
          const absl::Time deadline = absl::Now() + FromMillisString(args[0]);
          std::vector<std::string> keys(args.begin() + 1, args.end());
          auto ready = [&] {
            for (const std::string& k : keys) {
              if (data_.count(k) == 0) return false;
            }
            return true;
          };
          while (!ready() && !stop_) {
            if (deadline == absl::InfiniteFuture()) {
              cv_.wait(lock);
            } else if (cv_.wait_until(lock, absl::ToChronoTime(deadline)) ==
                           std::cv_status::timeout &&
                       !ready()) {
              break;
            }
          }
          if (!ready()) {
            code = kTimeout;
            for (const std::string& k : keys) {
              if (data_.count(k) == 0) reply.push_back(k);
            }
          } else if (op == kGet) {
            reply.push_back(data_[keys[0]]);
          }
          break;
        }
        case kAdd: {
          int64_t delta = 0, value = 0;
          if (args.size() != 2 || !absl::SimpleAtoi(args[1], &delta)) {
            code = kError;
            break;
          }
          auto it = data_.find(args[0]);
          if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
            code = kError;
            reply.push_back("value of " + args[0] + " is not an integer");
            break;
          }
          value += delta;
          data_[args[0]] = std::to_string(value);
          reply.push_back(std::to_string(value));
          cv_.notify_all();
          break;
        }
        case kCheck: {
          bool all = true;
          for (const std::string& k : args) all = all && data_.count(k) > 0;
          reply.push_back(all ? "1" : "0");
          break;
        }
        case kDelete:
          for (const std::string& k : args) data_.erase(k);
          break;
        case kHello: {
          int announced = -1;
          const std::string job = args.size() > 1 ? args[1] : "";
          if (args.empty() || args.size() > 2 ||
              !absl::SimpleAtoi(args[0], &announced)) {
            code = kError;
          } else if (job != job_id_) {
            // Not recorded as a rank: its leaving is not this job's loss.
            code = kError;
            reply.push_back(absl::StrCat(
                "rank ", announced, " of job '", job,
                "' reached the rendezvous store of job '", job_id_,
                "' on port ", port_,
                ": two jobs were given the same MASTER_ADDR:MASTER_PORT; "
                "give each job its own port"));
          } else {
            rank = announced;
          }
          break;
        }
        case kBye:
          said_bye = true;
          break;
        case kLost:
          for (int r : lost_ranks_) reply.push_back(std::to_string(r));
          break;
        default:
          code = kError;
          reply.push_back(std::string("unknown store operation ") + op);
      }
    }
    if (!WriteMessage(fd, code, reply, absl::Now() + absl::Seconds(30)).ok()) {
      break;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (rank >= 0 && !said_bye && !stop_) {
    lost_ranks_.insert(rank);
    LOG(WARNING) << "rendezvous store: lost connection to rank " << rank;
  }
  client_fds_.erase(fd);
  close(fd);
}

absl::StatusOr<std::shared_ptr<TcpStore>> TcpStore::Connect(
    const Options& options) {
  std::shared_ptr<TcpStore> store(new TcpStore);
  store->options_ = options;
  if (options.is_server) {
    absl::StatusOr<std::unique_ptr<TcpStoreServer>> server =
        TcpStoreServer::Start(options.host, options.port, options.job_id);
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
  if (options.rank >= 0) {
    std::vector<std::string> hello = {std::to_string(options.rank)};
    if (!options.job_id.empty()) hello.push_back(options.job_id);
    MCC_RETURN_IF_ERROR(
        store->Call(kHello, hello, absl::ZeroDuration()).status());
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
      Call(kBye, {}, absl::ZeroDuration()).IgnoreError();
    }
    close(fd_);
  }
  server_.reset();
}

absl::StatusOr<std::vector<std::string>> TcpStore::Call(
    char op, const std::vector<std::string>& args, absl::Duration wait) {
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Time deadline = wait == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + wait + absl::Seconds(10);
  auto lost = [&](const absl::Status& s) {
    return absl::UnavailableError(absl::StrCat(
        "lost the rendezvous store at ", options_.host, ":", options_.port,
        " (hosted by rank 0; rank 0 may have exited or died): ", s.message()));
  };
  absl::Status s = WriteMessage(fd_, op, args, deadline);
  if (!s.ok()) return lost(s);
  char code = 0;
  std::vector<std::string> reply;
  s = ReadMessage(fd_, &code, &reply, deadline);
  if (!s.ok()) return lost(s);
  if (code == kTimeout) {
    return absl::DeadlineExceededError(absl::StrCat(
        "rendezvous store: timed out after ", absl::FormatDuration(wait),
        " waiting for key(s) ", absl::StrJoin(reply, ", ")));
  }
  if (code != kOk) {
    return absl::InternalError(
        absl::StrCat("rendezvous store error: ", absl::StrJoin(reply, "; ")));
  }
  return reply;
}

absl::Status TcpStore::Set(absl::string_view key, absl::string_view value) {
  return Call(kSet, {std::string(key), std::string(value)},
              absl::ZeroDuration())
      .status();
}

absl::StatusOr<std::string> TcpStore::Get(absl::string_view key,
                                          absl::Duration timeout) {
  MCC_ASSIGN_OR_RETURN(
      std::vector<std::string> reply,
      Call(kGet, {ToMillisString(timeout), std::string(key)}, timeout));
  if (reply.size() != 1) return absl::DataLossError("store: bad Get reply");
  return std::move(reply[0]);
}

absl::Status TcpStore::Wait(absl::Span<const std::string> keys,
                            absl::Duration timeout) {
  std::vector<std::string> args = {ToMillisString(timeout)};
  args.insert(args.end(), keys.begin(), keys.end());
  return Call(kWait, args, timeout).status();
}

absl::StatusOr<int64_t> TcpStore::Add(absl::string_view key, int64_t delta) {
  MCC_ASSIGN_OR_RETURN(std::vector<std::string> reply,
                       Call(kAdd, {std::string(key), std::to_string(delta)},
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
      Call(kCheck, std::vector<std::string>(keys.begin(), keys.end()),
           absl::ZeroDuration()));
  return reply.size() == 1 && reply[0] == "1";
}

absl::Status TcpStore::Delete(absl::string_view key) {
  return Call(kDelete, {std::string(key)}, absl::ZeroDuration()).status();
}

absl::StatusOr<std::vector<int>> TcpStore::LostRanks() {
  MCC_ASSIGN_OR_RETURN(std::vector<std::string> reply,
                       Call(kLost, {}, absl::ZeroDuration()));
  std::vector<int> ranks;
  for (const std::string& r : reply) {
    int v = 0;
    if (absl::SimpleAtoi(r, &v)) ranks.push_back(v);
  }
  return ranks;
}

}  // namespace comm
}  // namespace mcc
