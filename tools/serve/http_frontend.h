#ifndef TOOLS_SERVE_HTTP_FRONTEND_H_
#define TOOLS_SERVE_HTTP_FRONTEND_H_

// The HTTP side of tools/serve (cpp-httplib): PUT /api (Megatron's
// text-generation API), POST /v1/completions (OpenAI-style, streamed as
// server-sent events on request), GET /health and GET /metrics, all handed
// to one inference::Engine.

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "data/tokenizer.h"
#include "data/tokenizer_config.h"
#include "httplib.h"
#include "inference/engine.h"
#include "tools/serve/chat_frontend.h"
#include "tools/serve/guarded_server.h"

namespace mcc {
namespace serve {

struct FrontendOptions {
  std::string model_name = "gpt";
  // Bodies longer than this are refused (413) as their Content-Length or
  // chunk sizes arrive, before they are buffered.
  size_t max_body_bytes = 1 << 20;
  int http_threads = 128;  // Complete requests handled at once.
  // Clients must send "Authorization: Bearer <api_key>" on every route but
  // /health (401 otherwise); empty: no key.
  std::string api_key;
  // A request still generating after this is ended in the engine (504, or
  // finish_reason "timeout" when streamed). Zero: no limit.
  absl::Duration request_timeout = absl::ZeroDuration();
  // A request's head and body must arrive within read_timeout (408); an idle
  // kept-alive connection is closed after idle_timeout.
  absl::Duration read_timeout = absl::Seconds(10);
  absl::Duration idle_timeout = absl::Seconds(5);
  int max_connections = 1024;  // More are refused (503).
  // Bytes of requests still arriving, together (503 past it); at least twice
  // max_body_bytes.
  size_t max_buffered_bytes = size_t{256} << 20;
  // The chat template for POST /v1/chat/completions (chat_frontend.h);
  // none: that route answers 404 saying so.
  std::optional<data::ChatTemplateConfig> chat;
};

// Thread-safe: handlers run on the server's threads; the engine runs on its
// own thread (Engine::Run) and must outlive the frontend.
class HttpFrontend {
 public:
  HttpFrontend(inference::Engine* engine,
               std::unique_ptr<data::Tokenizer> tokenizer,
               FrontendOptions options);
  ~HttpFrontend();

  // Binds host:port (port 0: a free port); returns the port bound.
  absl::StatusOr<int> Bind(const std::string& host, int port);
  // Serves until Stop (from any thread): OK then; an error when the server
  // stopped accepting connections otherwise.
  absl::Status Listen();
  void Stop();
  int open_connections() const { return server_.open_connections(); }
  // /health answers 503 from now on (the engine failed).
  void SetUnhealthy(const std::string& why);

 private:
  void HandleMegatron(const httplib::Request& req, httplib::Response& res);
  void HandleCompletions(const httplib::Request& req, httplib::Response& res);
  bool Authorized(const httplib::Request& req) const;
  absl::StatusOr<std::vector<int64_t>> Encode(const std::string& text);
  absl::Time Deadline() const;
  std::string Decode(const std::vector<int64_t>& ids);
  uint64_t NextSeed();

  inference::Engine* engine_;
  FrontendOptions options_;
  GuardedServer server_;
  int port_ = 0;
  std::atomic<bool> stop_requested_{false};
  absl::Mutex tokenizer_mu_;
  std::unique_ptr<data::Tokenizer> tokenizer_ ABSL_GUARDED_BY(tokenizer_mu_);
  absl::Mutex seed_mu_;
  std::mt19937_64 seeds_ ABSL_GUARDED_BY(seed_mu_);
  std::atomic<uint64_t> next_completion_{1};
  absl::Mutex health_mu_;
  std::string unhealthy_ ABSL_GUARDED_BY(health_mu_);
  absl::StatusOr<std::unique_ptr<ChatFrontend>> chat_;  // Bind reports it
};

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_HTTP_FRONTEND_H_
