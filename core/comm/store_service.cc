#include "core/comm/store_service.h"

#include <climits>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/comm/store_auth.h"
#include "core/comm/store_message.h"
#include "glog/logging.h"

namespace mcc {
namespace comm {
namespace {

// A Get's or Wait's timeout argument: milliseconds, -1 for none.
bool ParseTimeout(const std::string& s, absl::Duration* out) {
  int64_t ms = 0;
  if (!absl::SimpleAtoi(s, &ms) || ms < -1) return false;
  *out = ms == -1 ? absl::InfiniteDuration() : absl::Milliseconds(ms);
  return true;
}

std::string Printable(const std::string& s, size_t max = 64) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\'') {
      out.push_back(static_cast<char>(c));
    } else {
      absl::StrAppendFormat(&out, "\\x%02x", c);
    }
  }
  if (s.size() > max) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

}  // namespace

const char* StoreOpName(char op) {
  switch (op) {
    case kStoreSet:
      return "set";
    case kStoreGet:
      return "get";
    case kStoreWait:
      return "wait";
    case kStoreAdd:
      return "add";
    case kStoreCheck:
      return "check";
    case kStoreDelete:
      return "delete";
    case kStoreChallenge:
      return "challenge";
    case kStoreHello:
      return "hello";
    case kStoreBye:
      return "bye";
    case kStoreLost:
      return "lost-ranks";
    default:
      return "unknown";
  }
}

StoreService::StoreService(std::string job_id, std::string secret,
                           StoreLimits limits, int port)
    : job_id_(std::move(job_id)),
      secret_(std::move(secret)),
      limits_(limits),
      port_(port) {}

StoreReply StoreService::Error(const StoreSession& s, char op,
                               const std::string& problem, char code) {
  StoreReply reply;
  reply.code = code;
  const unsigned char byte = static_cast<unsigned char>(op);
  const std::string what =
      byte >= 0x20 && byte < 0x7f
          ? absl::StrFormat("'%c' (%s)", op, StoreOpName(op))
          : absl::StrFormat("0x%02x (%s)", byte, StoreOpName(op));
  reply.args.push_back(absl::StrCat("rendezvous store on port ", port_,
                                    ": request ", what, " from ", s.peer, ": ",
                                    problem));
  // Anyone can send these: log some, never a flood.
  int64_t n;
  {
    std::lock_guard<std::mutex> lock(mu_);
    n = ++problems_logged_;
  }
  if (n <= 20 || n % 1000 == 0) {
    LOG(WARNING) << reply.args.back()
                 << (n > 20 ? absl::StrCat(" (", n, " refused requests)") : "");
  }
  return reply;
}

bool StoreService::CheckKey(const StoreSession& s, char op,
                            const std::string& key, StoreReply* reply) {
  if (key.empty()) {
    *reply = Error(s, op, "empty key");
    return false;
  }
  if (key.size() > limits_.max_key_bytes) {
    *reply = Error(
        s, op,
        absl::StrCat("key '", Printable(key), "' of ", key.size(),
                     " bytes, more than the limit of ", limits_.max_key_bytes));
    return false;
  }
  return true;
}

bool StoreService::Put(const StoreSession& s, char op, const std::string& key,
                       std::string value, StoreReply* reply) {
  auto it = data_.find(key);
  const int64_t old_size =
      it == data_.end() ? 0
                        : static_cast<int64_t>(key.size() + it->second.size());
  const int64_t new_size = static_cast<int64_t>(key.size() + value.size());
  const int64_t total = stored_bytes_ - old_size + new_size;
  if (new_size > old_size && total > limits_.max_stored_bytes) {
    // Error() takes mu_ for its log count: build the reply without it.
    reply->code = kStoreError;
    reply->args = {absl::StrCat(
        "rendezvous store on port ", port_, ": request ", StoreOpName(op),
        " from ", s.peer, ": storing key '", Printable(key), "' (", new_size,
        " bytes) would hold ", total, " bytes, more than the store's limit of ",
        limits_.max_stored_bytes, " bytes (StoreLimits::max_stored_bytes)")};
    LOG_EVERY_N(WARNING, 100) << reply->args[0];
    return false;
  }
  if (it == data_.end()) {
    data_.emplace(key, std::move(value));
  } else {
    it->second = std::move(value);
  }
  stored_bytes_ = total;
  cv_.notify_all();
  return true;
}

StoreReply StoreService::Hello(StoreSession* s,
                               const std::vector<std::string>& args) {
  const char op = kStoreHello;
  if (s->hello_done) {
    return Error(*s, op, "a second hello on one connection");
  }
  if (args.empty() || args.size() > 3) {
    return Error(*s, op,
                 absl::StrCat(args.size(),
                              " argument(s); hello takes a rank, then "
                              "optionally the job id and the proof of the "
                              "job secret"));
  }
  int announced = -1;
  if (!absl::SimpleAtoi(args[0], &announced) || announced < -1) {
    return Error(*s, op,
                 absl::StrCat("rank '", Printable(args[0]),
                              "' is not an integer of at least -1"));
  }
  const std::string job = args.size() > 1 ? args[1] : "";
  if (requires_auth()) {
    // One answer per nonce: a failed or replayed proof ends the connection.
    const std::string nonce = std::move(s->nonce);
    s->nonce.clear();
    std::string problem;
    if (nonce.empty()) {
      problem = "no challenge was asked for before the hello";
    } else if (args.size() < 3) {
      problem = "the hello carries no proof of the job secret";
    } else if (!ConstantTimeEquals(
                   args[2], StoreHelloMac(secret_, nonce, job, announced))) {
      problem = "the proof of the job secret is wrong";
    }
    if (!problem.empty()) {
      StoreReply reply = Error(
          *s, op,
          absl::StrCat(
              "authentication failed for rank ", announced, ": ", problem,
              ". This store requires the job's secret (MCC_JOB_SECRET or "
              "MCC_JOB_SECRET_FILE, which tools/launch sets; across nodes "
              "give every launcher the same --rdzv-secret-file); a rank of "
              "another job given this port has another secret"),
          kStoreDenied);
      reply.close = true;
      return reply;
    }
  }
  if (job != job_id_) {
    // Not recorded as a rank: its leaving is not this job's loss.
    StoreReply reply;
    reply.code = kStoreDenied;
    reply.close = true;
    reply.args.push_back(
        absl::StrCat("rank ", announced, " of job '", job,
                     "' reached the rendezvous store of job '", job_id_,
                     "' on port ", port_, " (from ", s->peer,
                     "): two jobs were given the same MASTER_ADDR:MASTER_PORT; "
                     "give each job its own port"));
    return reply;
  }
  s->hello_done = true;
  s->authenticated = true;
  s->rank = announced;
  return StoreReply();
}

StoreReply StoreService::Handle(StoreSession* s, char op,
                                const std::vector<std::string>& args) {
  const size_t n = args.size();
  if (op == kStoreChallenge) {
    if (n != 0) return Error(*s, op, "a challenge request takes no arguments");
    absl::StatusOr<std::string> nonce = RandomBytes(kStoreNonceBytes);
    if (!nonce.ok())
      return Error(*s, op, std::string(nonce.status().message()));
    s->nonce = *nonce;
    StoreReply reply;
    reply.args.push_back(std::move(*nonce));
    return reply;
  }
  if (op == kStoreHello) return Hello(s, args);
  if (!Authorized(*s)) {
    StoreReply reply = Error(
        *s, op,
        "this store requires the job's secret, and the connection has not "
        "proved it in a hello; set MCC_JOB_SECRET or MCC_JOB_SECRET_FILE as "
        "tools/launch does",
        kStoreDenied);
    reply.close = true;
    return reply;
  }
  StoreReply reply;
  switch (op) {
    case kStoreSet: {
      if (n != 2) {
        return Error(*s, op,
                     absl::StrCat(n,
                                  " argument(s); set takes a key and a "
                                  "value"));
      }
      if (!CheckKey(*s, op, args[0], &reply)) return reply;
      std::lock_guard<std::mutex> lock(mu_);
      Put(*s, op, args[0], args[1], &reply);
      return reply;
    }
    case kStoreGet:
    case kStoreWait: {
      if (op == kStoreGet && n != 2) {
        return Error(*s, op,
                     absl::StrCat(n,
                                  " argument(s); get takes a timeout and "
                                  "exactly one key"));
      }
      if (op == kStoreWait && n < 2) {
        return Error(*s, op,
                     absl::StrCat(n,
                                  " argument(s); wait takes a timeout and "
                                  "at least one key"));
      }
      absl::Duration timeout;
      if (!ParseTimeout(args[0], &timeout)) {
        return Error(*s, op,
                     absl::StrCat("timeout '", Printable(args[0]),
                                  "' is not milliseconds (or -1 for none)"));
      }
      for (size_t i = 1; i < n; ++i) {
        if (!CheckKey(*s, op, args[i], &reply)) return reply;
      }
      timeout = std::min(timeout, limits_.max_wait);
      const absl::Time deadline = absl::Now() + timeout;
      std::unique_lock<std::mutex> lock(mu_);
      auto ready = [&] {
        for (size_t i = 1; i < n; ++i) {
          if (data_.count(args[i]) == 0) return false;
        }
        return true;
      };
      while (!ready() && !stopping_) {
        if (deadline == absl::InfiniteFuture()) {
          cv_.wait(lock);
        } else if (absl::Now() >= deadline ||
                   cv_.wait_until(lock, absl::ToChronoTime(deadline)) ==
                       std::cv_status::timeout) {
          break;
        }
      }
      if (!ready()) {
        reply.code = kStoreTimeout;
        for (size_t i = 1; i < n; ++i) {
          if (data_.count(args[i]) == 0) reply.args.push_back(args[i]);
        }
      } else if (op == kStoreGet) {
        reply.args.push_back(data_[args[1]]);
      }
      return reply;
    }
    case kStoreAdd: {
      int64_t delta = 0;
      if (n != 2) {
        return Error(*s, op,
                     absl::StrCat(n,
                                  " argument(s); add takes a key and an "
                                  "integer"));
      }
      if (!CheckKey(*s, op, args[0], &reply)) return reply;
      if (!absl::SimpleAtoi(args[1], &delta)) {
        return Error(*s, op,
                     absl::StrCat("increment '", Printable(args[1]),
                                  "' is not a 64-bit integer"));
      }
      std::lock_guard<std::mutex> lock(mu_);
      int64_t value = 0;
      auto it = data_.find(args[0]);
      if (it != data_.end() && !absl::SimpleAtoi(it->second, &value)) {
        reply.code = kStoreError;
        reply.args.push_back(absl::StrCat("rendezvous store on port ", port_,
                                          ": value of ", Printable(args[0]),
                                          " is not an integer"));
        return reply;
      }
      if (__builtin_add_overflow(value, delta, &value)) {
        reply.code = kStoreError;
        reply.args.push_back(absl::StrCat(
            "rendezvous store on port ", port_, ": adding ", delta, " to ",
            Printable(args[0]), " overflows a 64-bit integer"));
        return reply;
      }
      if (Put(*s, op, args[0], std::to_string(value), &reply)) {
        reply.args.push_back(std::to_string(value));
      }
      return reply;
    }
    case kStoreCheck: {
      for (const std::string& k : args) {
        if (!CheckKey(*s, op, k, &reply)) return reply;
      }
      std::lock_guard<std::mutex> lock(mu_);
      bool all = true;
      for (const std::string& k : args) all = all && data_.count(k) > 0;
      reply.args.push_back(all ? "1" : "0");
      return reply;
    }
    case kStoreDelete: {
      if (n != 1) {
        return Error(*s, op,
                     absl::StrCat(n, " argument(s); delete takes one key"));
      }
      if (!CheckKey(*s, op, args[0], &reply)) return reply;
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(args[0]);
      if (it != data_.end()) {
        stored_bytes_ -=
            static_cast<int64_t>(it->first.size() + it->second.size());
        data_.erase(it);
      }
      return reply;
    }
    case kStoreBye:
      if (n != 0) return Error(*s, op, "bye takes no arguments");
      s->said_bye = true;
      return reply;
    case kStoreLost: {
      if (n != 0) return Error(*s, op, "lost-ranks takes no arguments");
      std::lock_guard<std::mutex> lock(mu_);
      for (int r : lost_ranks_) reply.args.push_back(std::to_string(r));
      return reply;
    }
    default:
      return Error(*s, op, "unknown store operation");
  }
}

void StoreService::EndSession(const StoreSession& session) {
  std::lock_guard<std::mutex> lock(mu_);
  if (session.rank >= 0 && !session.said_bye && !stopping_) {
    lost_ranks_.insert(session.rank);
    LOG(WARNING) << "rendezvous store: lost connection to rank " << session.rank
                 << " (" << session.peer << ")";
  }
}

void StoreService::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
}

int64_t StoreService::stored_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_bytes_;
}

int64_t StoreService::CountStoredBytes() {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t total = 0;
  for (const auto& kv : data_) {
    total += static_cast<int64_t>(kv.first.size() + kv.second.size());
  }
  return total;
}

std::vector<int> StoreService::lost_ranks() {
  std::lock_guard<std::mutex> lock(mu_);
  return std::vector<int>(lost_ranks_.begin(), lost_ranks_.end());
}

}  // namespace comm
}  // namespace mcc
