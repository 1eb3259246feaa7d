#ifndef CORE_COMM_STORE_SERVICE_H_
#define CORE_COMM_STORE_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/time/time.h"

namespace mcc {
namespace comm {

// Bounds on what the rendezvous store accepts from its clients.
struct StoreLimits {
  // Keys plus values held at once; a Set or Add past it is an error reply.
  int64_t max_stored_bytes = int64_t{512} << 20;
  // Bytes of one key.
  size_t max_key_bytes = 64 << 10;
  // Client connections served at once; more are refused (TcpStoreServer).
  int max_connections = 1024;
  // Once a request's first byte arrived, the rest must arrive within this.
  absl::Duration message_deadline = absl::Seconds(30);
  // Where the store has a secret: a connection must finish its hello within
  // this of connecting, and its messages until then are at most
  // max_unauthenticated_message_bytes.
  absl::Duration hello_deadline = absl::Seconds(10);
  uint64_t max_unauthenticated_message_bytes = 4 << 10;
  // The longest a Get or Wait blocks, whatever its timeout asks (the
  // fuzzer sets zero).
  absl::Duration max_wait = absl::InfiniteDuration();
};

// One client connection as the service sees it.
struct StoreSession {
  std::string peer;  // "address:port", for messages.
  int rank = -1;     // Announced in the hello; -1 for none.
  bool hello_done = false;
  bool authenticated = false;
  bool said_bye = false;
  std::string nonce;  // The challenge sent and not yet answered.
};

struct StoreReply {
  char code = 0;  // StoreCode
  std::vector<std::string> args;
  bool close = false;  // Drop the connection after replying.
};

// The rendezvous store's state and request handling, apart from sockets so
// that a fuzzer can drive it: every request is checked (operation, argument
// count and format, authentication, limits) before it touches the map.
//
// With a secret, a session may send nothing but a challenge request and a
// hello until its hello proved it holds the secret; a failed proof ends the
// connection. Without one, every request is served, as for single-user runs.
class StoreService {
 public:
  StoreService(std::string job_id, std::string secret, StoreLimits limits,
               int port);

  bool requires_auth() const { return !secret_.empty(); }
  const StoreLimits& limits() const { return limits_; }
  // Whether the session may use the store (authenticated, or no secret).
  bool Authorized(const StoreSession& session) const {
    return secret_.empty() || session.authenticated;
  }

  // Handles one request. Get and Wait block (up to their timeout and
  // limits().max_wait) until their keys exist or Stop().
  StoreReply Handle(StoreSession* session, char op,
                    const std::vector<std::string>& args);
  // The connection closed: a rank that did not say goodbye is lost, unless
  // the service is stopping.
  void EndSession(const StoreSession& session);
  // Wakes blocked Gets and Waits, which then return.
  void Stop();

  int64_t stored_bytes();
  // Recounts keys and values (for the fuzzer's check of the running sum).
  int64_t CountStoredBytes();
  std::vector<int> lost_ranks();

 private:
  StoreReply Error(const StoreSession& s, char op, const std::string& problem,
                   char code = 2);
  StoreReply Hello(StoreSession* s, const std::vector<std::string>& args);
  // Whether the key is usable; otherwise *reply is the error.
  bool CheckKey(const StoreSession& s, char op, const std::string& key,
                StoreReply* reply);
  // Stores key = value within the byte limit (mu_ held).
  bool Put(const StoreSession& s, char op, const std::string& key,
           std::string value, StoreReply* reply);

  const std::string job_id_;
  const std::string secret_;
  const StoreLimits limits_;
  const int port_;

  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::map<std::string, std::string> data_;
  int64_t stored_bytes_ = 0;
  std::set<int> lost_ranks_;
  int64_t problems_logged_ = 0;
};

// A request's name for messages ("get", "set", ...; "unknown" otherwise).
const char* StoreOpName(char op);

}  // namespace comm
}  // namespace mcc

#endif  // CORE_COMM_STORE_SERVICE_H_
