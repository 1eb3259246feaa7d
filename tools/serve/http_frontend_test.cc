// HttpFrontend against hostile and careless clients, over real sockets: the
// engine behind it runs a FakeStepExecutor (no model), so each test costs
// what the server does, not what a model does.
#include "tools/serve/http_frontend.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "data/tokenizer.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "inference/engine.h"
#include "inference/fake_step_executor.h"
#include "inference/paged_kv_cache.h"
#include "nlohmann/json.hpp"

namespace mcc {
namespace serve {
namespace {

constexpr int64_t kBlocks = 64;
constexpr int64_t kBlockSize = 4;

// The byte tokenizer, except that it cannot encode the text "\x01fail" (as
// SentencePiece's library fails).
class FailingTokenizer : public data::Tokenizer {
 public:
  FailingTokenizer() : bytes_(data::MakeByteTokenizer()) {}
  std::string name() const override { return "failing"; }
  int64_t vocab_size() const override { return bytes_->vocab_size(); }
  int64_t eod() const override { return bytes_->eod(); }
  void Encode(absl::string_view text, std::vector<int32_t>* out) override {
    bytes_->Encode(text, out);
  }
  absl::Status TryEncode(absl::string_view text,
                         std::vector<int32_t>* out) override {
    if (text ==
        "\x01"
        "fail")
      return absl::InternalError("encoder broke");
    Encode(text, out);
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Decode(
      absl::Span<const int64_t> ids) const override {
    return bytes_->Decode(ids);
  }
  std::unique_ptr<Tokenizer> Clone() const override {
    return std::make_unique<FailingTokenizer>();
  }

 private:
  std::unique_ptr<data::Tokenizer> bytes_;
};

struct ServerSetup {
  inference::EngineOptions engine;
  FrontendOptions frontend;
  absl::Duration step_time = absl::ZeroDuration();
};

// An engine (fake model, context 128) behind a frontend on a free port.
class TestServer {
 public:
  explicit TestServer(ServerSetup setup) {
    inference::KvCacheShape shape;
    shape.num_layers = 1;
    shape.kv_heads = 1;
    shape.head_dim = 1;
    shape.block_size = kBlockSize;
    cache_ = std::make_unique<inference::PagedKvCache>(
        inference::PagedKvCache::WithBlocks(shape, kBlocks));
    executor_ = std::make_unique<inference::FakeStepExecutor>(264, kBlockSize,
                                                              /*favoured=*/200);
    executor_->set_step_time(setup.step_time);
    setup.engine.max_positions = 128;
    setup.engine.model_vocab = 264;
    engine_ = std::make_unique<inference::Engine>(
        setup.engine, executor_.get(), cache_.get(),
        std::make_unique<FailingTokenizer>());
    engine_thread_ = std::thread([this] { engine_status_ = engine_->Run(); });
    frontend_ = std::make_unique<HttpFrontend>(
        engine_.get(), std::make_unique<FailingTokenizer>(), setup.frontend);
    auto port = frontend_->Bind("127.0.0.1", 0);
    EXPECT_TRUE(port.ok()) << port.status();
    port_ = port.ok() ? *port : 0;
    listen_thread_ =
        std::thread([this] { listen_status_ = frontend_->Listen(); });
  }
  ~TestServer() {
    frontend_->Stop();
    listen_thread_.join();
    EXPECT_TRUE(listen_status_.ok()) << listen_status_;
    engine_->Stop();
    engine_thread_.join();
    frontend_.reset();
  }
  int port() const { return port_; }
  inference::Engine& engine() { return *engine_; }
  inference::FakeStepExecutor& executor() { return *executor_; }
  int64_t free_blocks() const { return cache_->free_blocks(); }
  const absl::Status& engine_status() const { return engine_status_; }
  // Waits until the engine has nothing left and every block is back.
  bool Drained(absl::Duration within = absl::Seconds(5)) {
    const absl::Time end = absl::Now() + within;
    while (absl::Now() < end) {
      if (engine_->unfinished() == 0 && cache_->free_blocks() == kBlocks) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

 private:
  std::unique_ptr<inference::PagedKvCache> cache_;
  std::unique_ptr<inference::FakeStepExecutor> executor_;
  std::unique_ptr<inference::Engine> engine_;
  std::unique_ptr<HttpFrontend> frontend_;
  absl::Status engine_status_, listen_status_;
  std::thread engine_thread_, listen_thread_;
  int port_ = 0;
};

httplib::Result Post(int port, const std::string& body,
                     const std::string& key = "") {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  httplib::Headers headers;
  if (!key.empty()) headers.emplace("Authorization", "Bearer " + key);
  return client.Post("/v1/completions", headers, body, "application/json");
}

int Connect(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n =
        ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

// What arrives within `timeout` or until the peer closes.
std::string ReadFor(int fd, absl::Duration timeout) {
  std::string out;
  const absl::Time end = absl::Now() + timeout;
  char buf[4096];
  while (absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) continue;
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
    if (absl::StrContains(out, "\r\n\r\n") &&
        absl::StrContains(out, "Connection: close") &&
        absl::EndsWith(out, "}")) {
      break;
    }
  }
  return out;
}

int64_t RssKiB() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "VmRSS:")) {
      return std::stoll(line.substr(6));
    }
  }
  return -1;
}

TEST(HttpFrontendTest, ApiKeyIsRequiredOnEveryRouteButHealth) {
  ServerSetup setup;
  setup.frontend.api_key = "s3cret-key";
  TestServer server(setup);
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  auto none = Post(server.port(), body);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_TRUE(absl::StrContains(none->body, "Authorization: Bearer"))
      << none->body;
  EXPECT_FALSE(absl::StrContains(none->body, "s3cret")) << none->body;
  auto wrong = Post(server.port(), body, "s3cret-kez");
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  auto prefix = Post(server.port(), body, "s3cret");
  ASSERT_TRUE(prefix);
  EXPECT_EQ(prefix->status, 401);
  auto right = Post(server.port(), body, "s3cret-key");
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  httplib::Client client("127.0.0.1", server.port());
  auto metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_EQ(metrics->status, 401);
  auto health = client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

// max_tokens of INT64_MAX once overflowed the engine's length check; the
// model runner then refused the step and serve exited.
TEST(HttpFrontendTest, MaxTokensOverflowIsA400AndTheServerLives) {
  TestServer server({});
  for (const char* body :
       {R"({"prompt": "hi", "max_tokens": 9223372036854775807})",
        R"({"prompt": "hi", "max_tokens": 9223372036854775806})"}) {
    auto res = Post(server.port(), body);
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, 400) << res->body;
    EXPECT_TRUE(absl::StrContains(res->body, "context of 128")) << res->body;
  }
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Put(
      "/api",
      R"({"prompts": ["hi"], "tokens_to_generate": 9223372036854775807})",
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  auto ok = Post(server.port(), R"({"prompt": "hi", "max_tokens": 3})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_TRUE(server.engine_status().ok()) << server.engine_status();
}

TEST(HttpFrontendTest, EncodeFailureIsA400) {
  TestServer server({});
  auto res =
      Post(server.port(), R"({"prompt": "\u0001fail", "max_tokens": 2})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_TRUE(absl::StrContains(res->body, "encoder broke")) << res->body;
}

TEST(HttpFrontendTest, PromptTokenLimitIsA400) {
  ServerSetup setup;
  setup.engine.max_prompt_tokens = 8;
  TestServer server(setup);
  auto res = Post(server.port(), R"({"prompt": "123456789", "max_tokens": 2})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400) << res->body;
  EXPECT_TRUE(absl::StrContains(res->body, "--max-prompt-tokens")) << res->body;
}

TEST(HttpFrontendTest, FullQueueIs429WithRetryAfter) {
  ServerSetup setup;
  setup.engine.scheduler.max_batch_size = 1;
  setup.engine.max_queued_requests = 1;
  setup.step_time = absl::Milliseconds(20);
  TestServer server(setup);
  const std::string slow = R"({"prompt": "hi", "max_tokens": 40})";
  std::vector<std::thread> clients;
  std::vector<int> statuses(2, 0);
  for (int i = 0; i < 2; ++i) {
    clients.emplace_back([&, i] {
      auto r = Post(server.port(), slow);
      statuses[i] = r ? r->status : -1;
    });
  }
  const absl::Time end = absl::Now() + absl::Seconds(10);
  while (server.engine().unfinished() < 2 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  auto refused = Post(server.port(), slow);
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 429) << refused->body;
  EXPECT_EQ(refused->get_header_value("Retry-After"), "1");
  EXPECT_TRUE(absl::StrContains(refused->body, "--max-queued-requests"))
      << refused->body;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(statuses, (std::vector<int>{200, 200}));
}

TEST(HttpFrontendTest, OversizedBodiesAreRefusedBeforeTheyAreBuffered) {
  ServerSetup setup;
  setup.frontend.max_body_bytes = 1 << 20;
  TestServer server(setup);
  const int64_t rss_before = RssKiB();
  // A chunked body that claims 100 MB in one chunk: refused at its size.
  {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n5F5E100\r\n"));
    const std::string answer = ReadFor(fd, absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 413")) << answer;
    ::close(fd);
  }
  // A chunked body of 64 KiB chunks sent as fast as the socket takes them,
  // up to 100 MB: refused once past 1 MiB, the rest read and dropped.
  int64_t sent = 0;
  {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        "Transfer-Encoding: chunked\r\n\r\n"));
    const std::string chunk =
        absl::StrCat("10000\r\n", std::string(65536, 'a'), "\r\n");
    std::string answer;
    while (sent < 100'000'000) {
      pollfd p{fd, POLLIN, 0};
      if (::poll(&p, 1, 0) > 0) break;  // The answer came.
      if (!SendAll(fd, chunk)) break;
      sent += static_cast<int64_t>(chunk.size());
    }
    answer = ReadFor(fd, absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 413")) << answer;
    ::close(fd);
  }
  // Compressed bodies are refused (a small one decompresses to any size).
  {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        "Content-Encoding: gzip\r\nContent-Length: 1000\r\n"
                        "\r\n"));
    const std::string answer = ReadFor(fd, absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 415")) << answer;
    ::close(fd);
  }
  // A Content-Length past the limit: refused before any byte of the body.
  {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd,
                        "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                        "Content-Length: 100000000\r\n\r\n"));
    const std::string answer = ReadFor(fd, absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 413")) << answer;
    ::close(fd);
  }
  const int64_t grown = RssKiB() - rss_before;
  std::printf(
      "chunked client sent %lld bytes before its 413; RSS grew by "
      "%lld KiB over the four refusals\n",
      static_cast<long long>(sent), static_cast<long long>(grown));
  EXPECT_LT(grown, 16 * 1024);
  // And the server still serves.
  auto ok = Post(server.port(), R"({"prompt": "hi", "max_tokens": 2})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200);
}

// Slow senders of large bodies together cannot hold more than the budget.
TEST(HttpFrontendTest, BytesBeingReceivedAreBoundedTogether) {
  ServerSetup setup;
  setup.frontend.max_body_bytes = 1 << 20;
  setup.frontend.max_buffered_bytes = 2 << 20;
  TestServer server(setup);
  const std::string head =
      "PUT /api HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
      "Content-Length: 1000000\r\n\r\n";
  std::vector<int> fds;
  for (int i = 0; i < 2; ++i) {
    fds.push_back(Connect(server.port()));
    ASSERT_GE(fds.back(), 0);
    ASSERT_TRUE(SendAll(fds.back(), head + std::string(900000, ' ')));
  }
  absl::SleepFor(absl::Milliseconds(200));
  const int third = Connect(server.port());
  ASSERT_GE(third, 0);
  ASSERT_TRUE(SendAll(third, head + std::string(400000, ' ')));
  const std::string refused = ReadFor(third, absl::Seconds(5));
  EXPECT_TRUE(absl::StartsWith(refused, "HTTP/1.1 503")) << refused;
  ::close(third);
  // The first two still complete (their bodies are not JSON: 400, not 503).
  for (int fd : fds) {
    ASSERT_TRUE(SendAll(fd, std::string(100000, ' ')));
    const std::string answer = ReadFor(fd, absl::Seconds(5));
    EXPECT_TRUE(absl::StartsWith(answer, "HTTP/1.1 400")) << answer;
    ::close(fd);
  }
}

// 200 connections that send a header line every 2 s once held every HTTP
// thread: /health did not answer within 30 s.
TEST(HttpFrontendTest, DribblingClientsDoNotDelayHealth) {
  ServerSetup setup;
  setup.frontend.http_threads = 8;
  TestServer server(setup);
  std::vector<int> slow;
  const absl::Time connecting = absl::Now();
  for (int i = 0; i < 200; ++i) {
    const int fd = Connect(server.port());
    ASSERT_GE(fd, 0) << i;
    ASSERT_TRUE(SendAll(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
    slow.push_back(fd);
  }
  std::printf("200 connections opened in %s\n",
              absl::FormatDuration(absl::Now() - connecting).c_str());
  absl::Duration worst;
  const absl::Time start = absl::Now();
  absl::Time next_line = start + absl::Seconds(2);
  while (absl::Now() - start < absl::Seconds(5)) {
    if (absl::Now() >= next_line) {
      for (int fd : slow) SendAll(fd, "X-Slow: 1\r\n");
      next_line += absl::Seconds(2);
    }
    const absl::Time t = absl::Now();
    httplib::Client client("127.0.0.1", server.port());
    client.set_read_timeout(10, 0);
    auto health = client.Get("/health");
    const absl::Duration took = absl::Now() - t;
    worst = std::max(worst, took);
    ASSERT_TRUE(health) << "no answer after " << took;
    EXPECT_EQ(health->status, 200);
    absl::SleepFor(absl::Milliseconds(200));
  }
  std::printf("worst /health latency with 200 dribbling clients: %s\n",
              absl::FormatDuration(worst).c_str());
  EXPECT_LT(worst, absl::Seconds(1));
  const absl::Time closing = absl::Now();
  for (int fd : slow) ::close(fd);
}

// A client that leaves stops its generation, and its KV blocks come back.
void ExpectLeavingCancels(bool stream) {
  ServerSetup setup;
  setup.step_time = absl::Milliseconds(10);
  TestServer server(setup);
  const std::string body = absl::StrCat(
      R"({"prompt": "hi", "max_tokens": 120, "ignore_eos": true, "stream": )",
      stream ? "true" : "false", "}");
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(SendAll(
      fd, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                       "Content-Type: application/json\r\nContent-Length: ",
                       body.size(), "\r\n\r\n", body)));
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (server.executor().steps() < 5 && absl::Now() < end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  EXPECT_LT(server.free_blocks(), kBlocks);
  ::close(fd);
  EXPECT_TRUE(server.Drained(absl::Seconds(2)))
      << "unfinished " << server.engine().unfinished() << ", free blocks "
      << server.free_blocks();
  // 120 tokens at 10 ms a step would take 1.2 s more.
  EXPECT_LT(server.executor().steps(), 100);
}

TEST(HttpFrontendTest, ClientThatLeavesCancelsItsGeneration) {
  ExpectLeavingCancels(/*stream=*/false);
}

TEST(HttpFrontendTest, StreamingClientThatLeavesCancelsItsGeneration) {
  ExpectLeavingCancels(/*stream=*/true);
}

TEST(HttpFrontendTest, RequestTimeoutEndsTheGenerationWith504) {
  ServerSetup setup;
  setup.step_time = absl::Milliseconds(10);
  setup.frontend.request_timeout = absl::Milliseconds(200);
  TestServer server(setup);
  auto res = Post(server.port(),
                  R"({"prompt": "hi", "max_tokens": 120, "ignore_eos": true})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 504) << res->body;
  EXPECT_TRUE(absl::StrContains(res->body, "--request-timeout")) << res->body;
  EXPECT_TRUE(server.Drained());
  auto streamed = Post(
      server.port(),
      R"({"prompt": "hi", "max_tokens": 120, "ignore_eos": true, "stream": true})");
  ASSERT_TRUE(streamed);
  EXPECT_EQ(streamed->status, 200);
  EXPECT_TRUE(absl::StrContains(streamed->body, R"("finish_reason":"timeout")"))
      << streamed->body;
  EXPECT_TRUE(server.Drained());
}

TEST(HttpFrontendTest, ExpectContinueIsAnsweredOnceAndKeepAliveServesMore) {
  TestServer server({});
  const std::string body = R"({"prompt": "hi", "max_tokens": 2})";
  const int fd = Connect(server.port());
  ASSERT_GE(fd, 0);
  ASSERT_TRUE(
      SendAll(fd, absl::StrCat("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                               "Expect: 100-continue\r\nContent-Length: ",
                               body.size(), "\r\n\r\n")));
  std::string got = ReadFor(fd, absl::Milliseconds(500));
  EXPECT_EQ(got, "HTTP/1.1 100 Continue\r\n\r\n");
  // The body, then two more requests pipelined in one write.
  const std::string health = "GET /health HTTP/1.1\r\nHost: x\r\n\r\n";
  ASSERT_TRUE(SendAll(fd, body + health + health));
  const absl::Time end = absl::Now() + absl::Seconds(5);
  char buf[4096];
  while (absl::Now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 20) <= 0) {
      if (absl::StrContains(got, R"({"status":"ok"}{"status":"ok"})") ||
          absl::EndsWith(got, R"({"status":"ok"})") &&
              got.find("200 OK") != got.rfind("200 OK")) {
        break;
      }
      continue;
    }
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  size_t oks = 0;
  for (size_t at = got.find("HTTP/1.1 200"); at != std::string::npos;
       at = got.find("HTTP/1.1 200", at + 1)) {
    ++oks;
  }
  EXPECT_EQ(oks, 3u) << got;
  size_t continues = 0;
  for (size_t at = got.find("100 Continue"); at != std::string::npos;
       at = got.find("100 Continue", at + 1)) {
    ++continues;
  }
  EXPECT_EQ(continues, 1u) << got;
  EXPECT_TRUE(absl::StrContains(got, "text_completion")) << got;
}

// An accept loop that fails (here: its socket shut down under it) is an
// error naming the port, not a clean return (which serve took as exit 0).
TEST(HttpFrontendTest, ListenReportsAnAcceptLoopThatStops) {
  inference::KvCacheShape shape;
  shape.num_layers = shape.kv_heads = shape.head_dim = 1;
  shape.block_size = kBlockSize;
  auto cache = inference::PagedKvCache::WithBlocks(shape, kBlocks);
  inference::FakeStepExecutor executor(264, kBlockSize, 200);
  inference::EngineOptions options;
  options.max_positions = 128;
  options.model_vocab = 264;
  inference::Engine engine(options, &executor, &cache, nullptr);
  HttpFrontend frontend(&engine, data::MakeByteTokenizer(), {});
  auto port = frontend.Bind("127.0.0.1", 0);
  ASSERT_TRUE(port.ok()) << port.status();
  absl::Status status;
  std::atomic<bool> returned{false};
  std::thread listen([&] {
    status = frontend.Listen();
    returned = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  // The listening socket of that port.
  int listening = -1;
  for (int fd = 3; fd < 4096 && listening < 0; ++fd) {
    sockaddr_in addr{};
    socklen_t len = sizeof(addr);
    int accepting = 0;
    socklen_t alen = sizeof(accepting);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 &&
        addr.sin_family == AF_INET && ntohs(addr.sin_port) == *port &&
        ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &accepting, &alen) == 0 &&
        accepting) {
      listening = fd;
    }
  }
  ASSERT_GE(listening, 0);
  ::shutdown(listening, SHUT_RDWR);
  const absl::Time end = absl::Now() + absl::Seconds(5);
  while (!returned && absl::Now() < end) absl::SleepFor(absl::Milliseconds(10));
  if (!returned) frontend.Stop();
  listen.join();
  EXPECT_TRUE(returned);
  EXPECT_FALSE(status.ok());
  EXPECT_TRUE(absl::StrContains(status.message(), absl::StrCat("port ", *port)))
      << status;
}

TEST(HttpFrontendTest, BindNamesThePortInUse) {
  TestServer server({});
  HttpFrontend second(&server.engine(), data::MakeByteTokenizer(), {});
  auto port = second.Bind("127.0.0.1", server.port());
  ASSERT_FALSE(port.ok());
  EXPECT_TRUE(absl::StrContains(port.status().message(),
                                absl::StrCat("--port ", server.port())))
      << port.status();
}

// ---- Chat: POST /v1/chat/completions and GET /v1/models. The fake model
// answers byte b with b + 1, so after the generation prompt's "a" it writes
// "bcdef...": the template's end-of-turn "def" ends the answer after "bc".

ServerSetup ChatSetup() {
  ServerSetup setup;
  setup.frontend.model_name = "tiny-chat";
  setup.frontend.chat = data::ChatTemplateConfig{
      "{% if messages[0].role == 'system' %}{% endif %}"
      "{% for m in messages %}"
      "{% if m.role not in ['system', 'user', 'assistant'] %}"
      "{{ raise_exception('unknown role ' ~ m.role) }}{% endif %}"
      "{{ m.role }}:{{ m.content }}def{% endfor %}"
      "{% if add_generation_prompt %}assistant:a{% endif %}",
      "", ""};
  return setup;
}

httplib::Result PostChat(int port, const std::string& body) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  return client.Post("/v1/chat/completions", body, "application/json");
}

TEST(HttpFrontendChatTest, TemplateAppliedAndStoppedAtEndOfTurn) {
  TestServer server(ChatSetup());
  auto res = PostChat(server.port(), R"({"model": "tiny-chat", "messages": [)"
                                     R"({"role": "system", "content": "S"},)"
                                     R"({"role": "user", "content": "hi"}],)"
                                     R"( "max_tokens": 10, "temperature": 0})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  auto j = nlohmann::json::parse(res->body);
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["model"], "tiny-chat");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "bc");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  const std::string rendered = "system:Sdefuser:hidefassistant:a";
  EXPECT_EQ(j["usage"]["prompt_tokens"], rendered.size());
  // The same prompt rendered by hand, through /v1/completions.
  auto plain = Post(server.port(), nlohmann::json({{"prompt", rendered},
                                                   {"max_tokens", 10},
                                                   {"temperature", 0},
                                                   {"stop", "def"}})
                                       .dump());
  ASSERT_TRUE(plain);
  ASSERT_EQ(plain->status, 200) << plain->body;
  EXPECT_EQ(nlohmann::json::parse(plain->body)["choices"][0]["text"], "bc");
  // Without the end of turn within max_tokens: "length".
  auto shorter =
      PostChat(server.port(),
               R"({"messages": [{"role": "user", "content": [{"type": "text",)"
               R"( "text": "h"}, {"type": "text", "text": "i"}]}],)"
               R"( "max_completion_tokens": 1, "temperature": 0})");
  ASSERT_TRUE(shorter);
  ASSERT_EQ(shorter->status, 200) << shorter->body;
  auto k = nlohmann::json::parse(shorter->body);
  EXPECT_EQ(k["choices"][0]["message"]["content"], "b");
  EXPECT_EQ(k["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(k["usage"]["completion_tokens"], 1);
  EXPECT_TRUE(server.Drained());
}

TEST(HttpFrontendChatTest, StreamedAsOpenAiChunks) {
  TestServer server(ChatSetup());
  auto res = PostChat(server.port(),
                      R"({"messages": [{"role": "user", "content": "hi"}],)"
                      R"( "max_tokens": 10, "temperature": 0, "stream": true,)"
                      R"( "stream_options": {"include_usage": true}})");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  EXPECT_TRUE(absl::StartsWith(res->get_header_value("Content-Type"),
                               "text/event-stream"));
  std::string content, finish, role;
  int usage_chunks = 0;
  bool done = false;
  for (absl::string_view line : absl::StrSplit(res->body, "\n\n")) {
    if (line.empty()) continue;
    ASSERT_TRUE(absl::StartsWith(line, "data: ")) << line;
    line.remove_prefix(6);
    if (line == "[DONE]") {
      done = true;
      continue;
    }
    ASSERT_FALSE(done) << "an event after [DONE]";
    auto chunk = nlohmann::json::parse(line);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    if (chunk.contains("usage")) {
      ++usage_chunks;
      EXPECT_TRUE(chunk["choices"].empty());
      // "b c" and the end of turn "d e f" were generated.
      EXPECT_EQ(chunk["usage"]["completion_tokens"], 5);
      continue;
    }
    const auto& choice = chunk["choices"][0];
    if (choice["delta"].contains("role")) role = choice["delta"]["role"];
    if (choice["delta"].contains("content")) {
      content += choice["delta"]["content"].get<std::string>();
    }
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
  }
  EXPECT_TRUE(done);
  EXPECT_EQ(role, "assistant");
  EXPECT_EQ(content, "bc");
  EXPECT_EQ(finish, "stop");
  EXPECT_EQ(usage_chunks, 1);
  EXPECT_TRUE(server.Drained());
}

TEST(HttpFrontendChatTest, ModelsListsTheServedModel) {
  TestServer server(ChatSetup());
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/v1/models");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  auto j = nlohmann::json::parse(res->body);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1);
  EXPECT_EQ(j["data"][0]["id"], "tiny-chat");
  EXPECT_EQ(j["data"][0]["object"], "model");
}

TEST(HttpFrontendChatTest, MalformedChatRequestsAre400AndTheServerLives) {
  TestServer server(ChatSetup());
  const std::string deep(5000, '[');
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"not json", "JSON"},
      {"[]", "object"},
      {R"({})", "messages"},
      {R"({"messages": "hi"})", "messages"},
      {R"({"messages": []})", "messages"},
      {R"({"messages": [1]})", "messages[0]"},
      {R"({"messages": [{"content": "x"}]})", "messages[0].role"},
      {R"({"messages": [{"role": "user"}]})", "messages[0].content"},
      {R"({"messages": [{"role": "user", "content": 7}]})", "content"},
      {R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
       "text"},
      {R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{}]}]})",
       "tool_calls"},
      {R"({"messages": [{"role": "robot", "content": "x"}]})",
       "unknown role robot"},
      {R"({"messages": [{"role": "user", "content": "x"}], "n": 2})", "n must"},
      {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true})",
       "logprobs"},
      {R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})",
       "tools"},
      {R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0})",
       "max_tokens"},
      {R"({"messages": [{"role": "user", "content": "x"}],)"
       R"( "max_tokens": 9223372036854775807})",
       "context of 128"},
      {R"({"messages": [{"role": "user", "content": "x"}], "temperature": 3})",
       "temperature"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ["a","b","c","d","e"]})",
       "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stop": ""})",
       "stop"},
      {R"({"messages": [{"role": "user", "content": "x"}], "stream": "yes"})",
       "stream"},
      {R"({"messages": [{"role": "user", "content": "x"}],)"
       R"( "stream_options": []})",
       "stream_options"},
      {R"({"messages": [{"role": "user", "content": ")" +
           std::string(200, 'x') + R"("}]})",
       "context of 128"},
      {deep, "JSON"},
  };
  for (const auto& [body, why] : bad) {
    auto res = PostChat(server.port(), body);
    ASSERT_TRUE(res) << body;
    EXPECT_EQ(res->status, 400) << body << " -> " << res->body;
    EXPECT_TRUE(absl::StrContains(res->body, why))
        << body.substr(0, 80) << " -> " << res->body;
    EXPECT_TRUE(nlohmann::json::accept(res->body)) << res->body;
  }
  auto ok = PostChat(server.port(),
                     R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_TRUE(server.Drained());
  EXPECT_TRUE(server.engine_status().ok()) << server.engine_status();
}

TEST(HttpFrontendChatTest, NoTemplateIs404AndABadOneFailsBind) {
  TestServer server({});
  auto res = PostChat(server.port(),
                      R"({"messages": [{"role": "user", "content": "hi"}]})");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404) << res->body;
  EXPECT_TRUE(absl::StrContains(res->body, "--tokenizer-config")) << res->body;

  inference::KvCacheShape shape;
  shape.num_layers = shape.kv_heads = shape.head_dim = 1;
  shape.block_size = kBlockSize;
  auto cache = inference::PagedKvCache::WithBlocks(shape, kBlocks);
  inference::FakeStepExecutor executor(264, kBlockSize, 200);
  inference::EngineOptions options;
  options.max_positions = 128;
  options.model_vocab = 264;
  inference::Engine engine(options, &executor, &cache,
                           std::make_unique<FailingTokenizer>());
  FrontendOptions fo;
  fo.chat = data::ChatTemplateConfig{"{% macro m() %}{% endmacro %}", "", ""};
  HttpFrontend frontend(&engine, std::make_unique<FailingTokenizer>(), fo);
  auto port = frontend.Bind("127.0.0.1", 0);
  ASSERT_FALSE(port.ok());
  EXPECT_TRUE(absl::StrContains(port.status().message(),
                                "{% macro %} is not supported"))
      << port.status();
}

}  // namespace
}  // namespace serve
}  // namespace mcc
