#ifndef TOOLS_SERVE_HTTP_FRONTEND_H_
#define TOOLS_SERVE_HTTP_FRONTEND_H_

// The HTTP side of tools/serve (cpp-httplib): PUT /api (Megatron's
// text-generation API), POST /v1/completions (OpenAI-style, streamed as
// server-sent events on request), GET /health and GET /metrics, all handed
// to one inference::Engine.

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "data/tokenizer.h"
#include "httplib.h"
#include "inference/engine.h"

namespace mcc {
namespace serve {

struct FrontendOptions {
  std::string model_name = "gpt";
  // Bodies longer than this are refused (413) from their Content-Length,
  // before they are read.
  size_t max_body_bytes = 1 << 20;
  int http_threads = 128;  // Concurrent connections served.
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
  // Serves until Stop (from any thread).
  void Listen();
  void Stop();
  // /health answers 503 from now on (the engine failed).
  void SetUnhealthy(const std::string& why);

 private:
  void HandleMegatron(const httplib::Request& req, httplib::Response& res);
  void HandleCompletions(const httplib::Request& req, httplib::Response& res);
  std::vector<int64_t> Encode(const std::string& text);
  std::string Decode(const std::vector<int64_t>& ids);
  uint64_t NextSeed();

  inference::Engine* engine_;
  FrontendOptions options_;
  httplib::Server server_;
  absl::Mutex tokenizer_mu_;
  std::unique_ptr<data::Tokenizer> tokenizer_ ABSL_GUARDED_BY(tokenizer_mu_);
  absl::Mutex seed_mu_;
  std::mt19937_64 seeds_ ABSL_GUARDED_BY(seed_mu_);
  std::atomic<uint64_t> next_completion_{1};
  absl::Mutex health_mu_;
  std::string unhealthy_ ABSL_GUARDED_BY(health_mu_);
};

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_HTTP_FRONTEND_H_
