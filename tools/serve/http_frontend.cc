#include "tools/serve/http_frontend.h"

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "nlohmann/json.hpp"
#include "tools/serve/completions_api.h"
#include "tools/serve/json_fields.h"
#include "tools/serve/megatron_api.h"

namespace mcc {
namespace serve {
namespace {

using inference::GenerationEvent;
using inference::GenerationRequest;

constexpr char kJson[] = "application/json";

// The events of one HTTP request's generations (one per prompt), from the
// engine thread to the handler's thread.
class Channel {
 public:
  explicit Channel(int generations) : open_(generations) {}
  void Push(int index, const GenerationEvent& event) {
    absl::MutexLock lock(&mu_);
    events_.emplace_back(index, event);
    if (event.finished) --open_;
  }
  // Waits up to `timeout` for events; moves them out.
  std::deque<std::pair<int, GenerationEvent>> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &Channel::HasEvents), timeout);
    std::deque<std::pair<int, GenerationEvent>> out;
    out.swap(events_);
    return out;
  }
  bool AllFinished() {
    absl::MutexLock lock(&mu_);
    return open_ == 0 && events_.empty();
  }

 private:
  bool HasEvents() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !events_.empty();
  }
  absl::Mutex mu_;
  std::deque<std::pair<int, GenerationEvent>> events_ ABSL_GUARDED_BY(mu_);
  int open_ ABSL_GUARDED_BY(mu_);
};

// Submitted generations; cancels the unfinished ones when dropped early.
struct Submission {
  inference::Engine* engine = nullptr;
  std::shared_ptr<Channel> channel;
  std::vector<uint64_t> ids;
  void CancelAll() {
    for (uint64_t id : ids) engine->Cancel(id);
  }
};

// Submits every request (all or none: a refusal cancels those before it).
absl::StatusOr<Submission> SubmitAll(inference::Engine* engine,
                                     std::vector<GenerationRequest> requests) {
  Submission s;
  s.engine = engine;
  s.channel = std::make_shared<Channel>(static_cast<int>(requests.size()));
  for (size_t i = 0; i < requests.size(); ++i) {
    std::shared_ptr<Channel> channel = s.channel;
    const int index = static_cast<int>(i);
    auto id = engine->Submit(std::move(requests[i]),
                             [channel, index](const GenerationEvent& e) {
                               channel->Push(index, e);
                             });
    if (!id.ok()) {
      s.CancelAll();
      return absl::Status(
          id.status().code(),
          requests.size() > 1
              ? absl::StrCat("prompt ", i, ": ", id.status().message())
              : std::string(id.status().message()));
    }
    s.ids.push_back(*id);
  }
  return s;
}

// Waits for every generation's last event; a client that leaves cancels
// them (false).
bool WaitAll(Submission& s, size_t n, std::vector<GenerationEvent>* out) {
  std::vector<GenerationEvent>& finals = *out;
  finals.assign(n, GenerationEvent());
  size_t done = 0;
  while (done < n) {
    if (GuardedServer::ClientLeft()) {
      s.CancelAll();
      return false;
    }
    for (auto& [index, event] : s.channel->Take(absl::Milliseconds(100))) {
      if (event.finished) {
        finals[index] = std::move(event);
        ++done;
      }
    }
  }
  return true;
}

// A refused request is the client's fault (400), or the queue is full (429),
// or the engine stopped (503).
int StatusOf(const absl::Status& status) {
  if (absl::IsInvalidArgument(status)) return 400;
  if (absl::IsResourceExhausted(status)) return 429;
  return 503;
}

void Reply(httplib::Response& res, int status, const std::string& body,
           const char* type = kJson) {
  res.status = status;
  if (status == 429 || status == 503) res.set_header("Retry-After", "1");
  res.set_content(body, type);
}

// Compares in time that depends only on the lengths, so the answer's timing
// does not tell a client how much of a key it guessed.
bool SameSecret(absl::string_view given, absl::string_view want) {
  unsigned char diff = given.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i) {
    diff |=
        static_cast<unsigned char>(given[i]) ^
        static_cast<unsigned char>(want.empty() ? 0 : want[i % want.size()]);
  }
  return diff == 0;
}

GuardOptions GuardsOf(const FrontendOptions& o) {
  GuardOptions g;
  g.max_body_bytes = o.max_body_bytes;
  g.workers = o.http_threads;
  g.read_timeout = o.read_timeout;
  g.idle_timeout = o.idle_timeout;
  g.max_connections = o.max_connections;
  g.max_buffered_bytes =
      std::max(o.max_buffered_bytes, 2 * o.max_body_bytes + (64 << 10));
  return g;
}

std::string TimeoutMessage(absl::Duration timeout) {
  return absl::StrCat(
      "the generation did not finish within the server's "
      "--request-timeout of ",
      absl::FormatDuration(timeout));
}

}  // namespace

HttpFrontend::HttpFrontend(inference::Engine* engine,
                           std::unique_ptr<data::Tokenizer> tokenizer,
                           FrontendOptions options)
    : engine_(engine),
      options_(std::move(options)),
      server_(GuardsOf(options_)),
      tokenizer_(std::move(tokenizer)),
      seeds_(std::random_device{}()) {
  // httplib's default adds SO_REUSEPORT, with which a second server binds a
  // port in use and takes half its connections.
  server_.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Before any handler: a request without the key gets no further than its
  // buffered (bounded) bytes.
  server_.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (Authorized(req)) return httplib::Server::HandlerResponse::Unhandled;
        engine_->metrics().RecordRejected();
        res.set_header("WWW-Authenticate", "Bearer");
        Reply(res, 401,
              ErrorBody("a valid API key is required: send the header "
                        "\"Authorization: Bearer KEY\"",
                        401));
        return httplib::Server::HandlerResponse::Handled;
      });
  server_.Put("/api",
              [this](const httplib::Request& req, httplib::Response& res) {
                HandleMegatron(req, res);
              });
  for (const char* path : {"/v1/completions", "/completions"}) {
    server_.Post(path,
                 [this](const httplib::Request& req, httplib::Response& res) {
                   HandleCompletions(req, res);
                 });
  }
  chat_ = ChatFrontend::Create(
      {engine_, [this](const std::string& s) { return Encode(s); },
       [this] { return Deadline(); }, [this] { return NextSeed(); },
       options_.model_name, options_.request_timeout},
      options_.chat);
  if (chat_.ok()) (*chat_)->Register(&server_);
  server_.Get(
      "/health", [this](const httplib::Request&, httplib::Response& res) {
        absl::MutexLock lock(&health_mu_);
        if (unhealthy_.empty()) {
          Reply(res, 200, R"({"status":"ok"})");
        } else {
          Reply(res, 503, Dump({{"status", "error"}, {"message", unhealthy_}}));
        }
      });
  server_.Get("/metrics", [this](const httplib::Request&,
                                 httplib::Response& res) {
    Reply(res, 200, engine_->metrics().Render(), "text/plain; version=0.0.4");
  });
  server_.set_error_handler(
      [](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return;
        std::string message;
        switch (res.status) {
          case 404:
            message = absl::StrCat("no endpoint ", req.method, " ", req.path,
                                   " (PUT /api, POST /v1/completions, POST "
                                   "/v1/chat/completions, GET /v1/models, "
                                   "GET /health, GET /metrics)");
            break;
          case 413:
            message = "the request body is larger than the server's limit";
            break;
          case 400:
            message = "a malformed HTTP request";
            break;
          default:
            message = absl::StrCat("HTTP ", res.status);
        }
        res.set_content(ErrorBody(message, res.status), kJson);
      });
  server_.set_exception_handler([](const httplib::Request&,
                                   httplib::Response& res,
                                   std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    LOG(ERROR) << "serve: a handler threw: " << what;
    Reply(res, 500, ErrorBody(what, 500));
  });
}

HttpFrontend::~HttpFrontend() { Stop(); }

absl::StatusOr<int> HttpFrontend::Bind(const std::string& host, int port) {
  if (!chat_.ok()) return chat_.status();  // A chat template it cannot run.
  int bound = -1;
  if (port == 0) {
    bound = server_.bind_to_any_port(host);
  } else if (server_.bind_to_port(host, port)) {
    bound = port;
  }
  if (bound > 0) {
    port_ = bound;
    server_.WidenBacklog();
  }
  if (bound <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on --host ", host, " --port ", port,
                     " (in use, or not an address of this machine)"));
  }
  return bound;
}

absl::Status HttpFrontend::Listen() {
  const bool clean = server_.listen_after_bind();
  const int error = errno;
  if (stop_requested_.load()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("stopped accepting connections on port ", port_,
                   clean ? "" : absl::StrCat(": ", std::strerror(error))));
}

void HttpFrontend::Stop() {
  stop_requested_ = true;
  server_.stop();
}

bool HttpFrontend::Authorized(const httplib::Request& req) const {
  if (options_.api_key.empty() || req.path == "/health") return true;
  const std::string given = req.get_header_value("Authorization");
  constexpr absl::string_view kBearer = "Bearer ";
  if (given.size() < kBearer.size() ||
      !absl::EqualsIgnoreCase(given.substr(0, kBearer.size()), kBearer)) {
    return false;
  }
  return SameSecret(absl::string_view(given).substr(kBearer.size()),
                    options_.api_key);
}

absl::Time HttpFrontend::Deadline() const {
  return options_.request_timeout > absl::ZeroDuration()
             ? absl::Now() + options_.request_timeout
             : absl::InfiniteFuture();
}

void HttpFrontend::SetUnhealthy(const std::string& why) {
  absl::MutexLock lock(&health_mu_);
  unhealthy_ = why;
}

absl::StatusOr<std::vector<int64_t>> HttpFrontend::Encode(
    const std::string& text) {
  std::vector<int32_t> ids;
  absl::MutexLock lock(&tokenizer_mu_);
  if (absl::Status s = tokenizer_->TryEncode(text, &ids); !s.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prompt cannot be tokenized: ", s.message()));
  }
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string HttpFrontend::Decode(const std::vector<int64_t>& ids) {
  absl::MutexLock lock(&tokenizer_mu_);
  auto text = tokenizer_->Decode(absl::MakeConstSpan(ids));
  return text.ok() ? *text : std::string();
}

uint64_t HttpFrontend::NextSeed() {
  absl::MutexLock lock(&seed_mu_);
  return seeds_();
}

void HttpFrontend::HandleMegatron(const httplib::Request& req,
                                  httplib::Response& res) {
  // Megatron answers errors as a JSON string with status 400.
  auto parsed = ParseMegatronRequest(req.body);
  if (!parsed.ok()) {
    engine_->metrics().RecordRejected();
    Reply(res, 400, Dump(std::string(parsed.status().message())));
    return;
  }
  int64_t eod = 0;
  {
    absl::MutexLock lock(&tokenizer_mu_);
    eod = tokenizer_->eod();
  }
  std::vector<GenerationRequest> requests;
  const uint64_t seed = parsed->random_seed.has_value()
                            ? static_cast<uint64_t>(*parsed->random_seed)
                            : NextSeed();
  const absl::Time deadline = Deadline();
  for (const std::string& prompt : parsed->prompts) {
    GenerationRequest r;
    if (parsed->add_BOS) r.prompt.push_back(eod);
    auto ids = Encode(prompt);
    if (!ids.ok()) {
      engine_->metrics().RecordRejected();
      Reply(res, 400, Dump(std::string(ids.status().message())));
      return;
    }
    r.prompt.insert(r.prompt.end(), ids->begin(), ids->end());
    r.deadline = deadline;
    r.max_new_tokens = parsed->tokens_to_generate;
    r.sampling.temperature = parsed->temperature;
    r.sampling.top_k = parsed->top_k;
    r.sampling.top_p = parsed->top_p;
    r.sampling.seed = seed;
    r.prompt_logprobs = parsed->logprobs;
    requests.push_back(std::move(r));
  }
  std::vector<std::vector<int64_t>> prompts;
  for (const GenerationRequest& r : requests) prompts.push_back(r.prompt);
  auto submission = SubmitAll(engine_, std::move(requests));
  if (!submission.ok()) {
    Reply(res, StatusOf(submission.status()),
          Dump(std::string(submission.status().message())));
    return;
  }
  std::vector<GenerationEvent> finals;
  if (!WaitAll(*submission, prompts.size(), &finals)) return;  // Client left.
  std::vector<MegatronResult> results;
  for (size_t i = 0; i < finals.size(); ++i) {
    const GenerationEvent& e = finals[i];
    if (e.finish_reason == inference::FinishReason::kTimeout) {
      Reply(res, 504, Dump(TimeoutMessage(options_.request_timeout)));
      return;
    }
    if (e.finish_reason == inference::FinishReason::kCancelled) {
      Reply(res, 503, Dump("the server stopped before the generation ended"));
      return;
    }
    MegatronResult r;
    r.prompt = parsed->prompts[i];
    r.tokens = prompts[i];
    r.tokens.insert(r.tokens.end(), e.tokens.begin(), e.tokens.end());
    for (int64_t t : r.tokens) r.segments.push_back(Decode({t}));
    r.logprobs = e.prompt_logprobs;
    r.logprobs.insert(r.logprobs.end(), e.logprobs.begin(), e.logprobs.end());
    r.generated_text = e.text;
    results.push_back(std::move(r));
  }
  Reply(res, 200, MegatronResponse(results, parsed->logprobs));
}

void HttpFrontend::HandleCompletions(const httplib::Request& req,
                                     httplib::Response& res) {
  auto parsed = ParseCompletionRequest(req.body);
  if (!parsed.ok()) {
    engine_->metrics().RecordRejected();
    Reply(res, 400, ErrorBody(std::string(parsed.status().message()), 400));
    return;
  }
  int64_t eod = 0;
  {
    absl::MutexLock lock(&tokenizer_mu_);
    eod = tokenizer_->eod();
  }
  const uint64_t seed = parsed->seed.has_value() ? *parsed->seed : NextSeed();
  std::vector<GenerationRequest> requests;
  int64_t prompt_tokens = 0;
  const absl::Time deadline = Deadline();
  for (const std::string& prompt : parsed->prompts) {
    GenerationRequest r;
    auto ids = Encode(prompt);
    if (!ids.ok()) {
      engine_->metrics().RecordRejected();
      Reply(res, 400, ErrorBody(std::string(ids.status().message()), 400));
      return;
    }
    r.prompt = std::move(*ids);
    r.deadline = deadline;
    if (r.prompt.empty()) r.prompt.push_back(eod);  // A new document.
    prompt_tokens += static_cast<int64_t>(r.prompt.size());
    r.max_new_tokens = parsed->max_tokens;
    r.sampling.temperature = parsed->temperature;
    r.sampling.top_k = parsed->top_k;
    r.sampling.top_p = parsed->top_p >= 1 ? 0.0 : parsed->top_p;
    r.sampling.seed = seed;
    r.stop = parsed->stop;
    r.stop_at_eod = !parsed->ignore_eos;
    requests.push_back(std::move(r));
  }
  const size_t n = requests.size();
  auto submission = SubmitAll(engine_, std::move(requests));
  if (!submission.ok()) {
    const int status = StatusOf(submission.status());
    Reply(res, status,
          ErrorBody(std::string(submission.status().message()), status));
    return;
  }
  const std::string id = absl::StrCat("cmpl-", next_completion_.fetch_add(1));
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  const std::string model =
      parsed->model.empty() ? options_.model_name : parsed->model;
  if (!parsed->stream) {
    std::vector<GenerationEvent> finals;
    if (!WaitAll(*submission, n, &finals)) return;  // The client left.
    std::vector<CompletionChoice> choices;
    int64_t completion_tokens = 0;
    for (const GenerationEvent& e : finals) {
      if (e.finish_reason == inference::FinishReason::kTimeout) {
        Reply(res, 504,
              ErrorBody(TimeoutMessage(options_.request_timeout), 504));
        return;
      }
      if (e.finish_reason == inference::FinishReason::kCancelled) {
        Reply(res, 503,
              ErrorBody("the server stopped before the generation ended", 503));
        return;
      }
      CompletionChoice c;
      c.text = e.text;
      c.finish_reason = inference::FinishReasonName(e.finish_reason);
      for (int64_t t : e.tokens) c.token_texts.push_back(Decode({t}));
      c.token_logprobs = e.logprobs;
      completion_tokens += static_cast<int64_t>(e.tokens.size());
      choices.push_back(std::move(c));
    }
    Reply(res, 200,
          CompletionResponse(id, created, model, choices,
                             parsed->logprobs.has_value(), prompt_tokens,
                             completion_tokens));
    return;
  }
  // Streamed: one event per generated token, one with the finish reason per
  // prompt, then [DONE]. A client that goes away cancels its generations.
  auto state = std::make_shared<Submission>(*submission);
  auto finished = std::make_shared<size_t>(0);
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [state, finished, n, id, created, model](size_t,
                                               httplib::DataSink& sink) {
        if (!sink.is_writable()) {
          state->CancelAll();
          return false;
        }
        for (auto& [index, event] :
             state->channel->Take(absl::Milliseconds(100))) {
          std::string chunk;
          if (event.has_token) {
            chunk = CompletionStreamEvent(id, created, model, index,
                                          event.text_delta, "");
          }
          if (event.finished) {
            const bool cancelled =
                event.finish_reason == inference::FinishReason::kCancelled;
            absl::StrAppend(
                &chunk, CompletionStreamEvent(
                            id, created, model, index, event.text_delta,
                            inference::FinishReasonName(event.finish_reason)));
            if (cancelled) LOG(WARNING) << id << ": generation cancelled";
            ++*finished;
          }
          if (!chunk.empty() && !sink.write(chunk.data(), chunk.size())) {
            state->CancelAll();
            return false;
          }
        }
        if (*finished == n) {
          sink.write(kStreamDone, sizeof(kStreamDone) - 1);
          sink.done();
        }
        return true;
      },
      [state](bool success) {
        if (!success) state->CancelAll();
      });
}

}  // namespace serve
}  // namespace mcc
