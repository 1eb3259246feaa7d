#include "tools/serve/chat_frontend.h"

#include <deque>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "glog/logging.h"
#include "tools/serve/chat_completions_api.h"
#include "tools/serve/completions_api.h"
#include "tools/serve/guarded_server.h"

namespace mcc {
namespace serve {
namespace {

using inference::GenerationEvent;

constexpr char kJson[] = "application/json";

void Reply(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  if (status == 429 || status == 503) res.set_header("Retry-After", "1");
  res.set_content(body, kJson);
}

void ReplyError(httplib::Response& res, int status,
                const std::string& message) {
  Reply(res, status, ErrorBody(message, status));
}

// The events of one generation, from the engine thread to the handler's.
class Events {
 public:
  void Push(const GenerationEvent& e) {
    absl::MutexLock lock(&mu_);
    events_.push_back(e);
  }
  std::deque<GenerationEvent> Take(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(this, &Events::Ready), timeout);
    std::deque<GenerationEvent> out;
    out.swap(events_);
    return out;
  }

 private:
  bool Ready() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !events_.empty();
  }
  absl::Mutex mu_;
  std::deque<GenerationEvent> events_ ABSL_GUARDED_BY(mu_);
};

// One submitted generation; a client that leaves cancels it.
struct Generation {
  inference::Engine* engine = nullptr;
  uint64_t id = 0;
  std::shared_ptr<Events> events = std::make_shared<Events>();
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  bool first = true;
  bool finished = false;
};

}  // namespace

std::string EndOfTurnText(const data::ChatTemplate& chat_template,
                          const data::ChatTemplateConfig& config) {
  static constexpr char kProbe[] = "\x01probe\x01";
  data::ChatTemplateInputs in;
  in.bos_token = config.bos_token;
  in.eos_token = config.eos_token;
  in.messages = {{"user", "hi"}, {"assistant", kProbe}};
  auto text = chat_template.Render(in);
  if (!text.ok()) return "";
  const size_t at = text->rfind(kProbe);
  if (at == std::string::npos) return "";
  return std::string(
      absl::StripAsciiWhitespace(text->substr(at + sizeof(kProbe) - 1)));
}

absl::StatusOr<std::unique_ptr<ChatFrontend>> ChatFrontend::Create(
    Hooks hooks, std::optional<data::ChatTemplateConfig> chat) {
  std::unique_ptr<ChatFrontend> f(new ChatFrontend());
  f->hooks_ = std::move(hooks);
  if (chat.has_value()) {
    auto t = data::ParseChatTemplateOf(*chat, "tokenizer_config.json");
    if (!t.ok()) return t.status();
    f->template_ = std::move(*t);
    const std::string end = EndOfTurnText(*f->template_, *chat);
    if (!end.empty()) f->end_of_turn_.push_back(end);
    if (!chat->eos_token.empty() && chat->eos_token != end) {
      f->end_of_turn_.push_back(chat->eos_token);
    }
    f->config_ = std::move(chat);
  }
  return f;
}

void ChatFrontend::Register(httplib::Server* server) {
  for (const char* path : {"/v1/chat/completions", "/chat/completions"}) {
    server->Post(path,
                 [this](const httplib::Request& req, httplib::Response& res) {
                   HandleChat(req, res);
                 });
  }
  for (const char* path : {"/v1/models", "/models"}) {
    server->Get(path,
                [this](const httplib::Request& req, httplib::Response& res) {
                  HandleModels(req, res);
                });
  }
}

void ChatFrontend::HandleModels(const httplib::Request&,
                                httplib::Response& res) {
  Reply(res, 200,
        ModelsResponse(hooks_.model_name, absl::ToUnixSeconds(absl::Now())));
}

void ChatFrontend::HandleChat(const httplib::Request& req,
                              httplib::Response& res) {
  inference::Engine* engine = hooks_.engine;
  if (!template_.has_value()) {
    engine->metrics().RecordRejected();
    ReplyError(res, 404,
               "this server has no chat template: start serve with "
               "--tokenizer-config naming a tokenizer_config.json that has "
               "a chat_template (POST /v1/completions takes raw text)");
    return;
  }
  auto parsed = ParseChatCompletionRequest(req.body);
  if (!parsed.ok()) {
    engine->metrics().RecordRejected();
    ReplyError(res, 400, std::string(parsed.status().message()));
    return;
  }
  data::ChatTemplateInputs in;
  in.messages = parsed->messages;
  in.add_generation_prompt = true;
  in.bos_token = config_->bos_token;
  in.eos_token = config_->eos_token;
  auto prompt = template_->Render(in);
  if (!prompt.ok()) {
    engine->metrics().RecordRejected();
    ReplyError(res, 400, absl::StrCat("messages: ", prompt.status().message()));
    return;
  }
  auto ids = hooks_.encode(*prompt);
  if (!ids.ok()) {
    engine->metrics().RecordRejected();
    ReplyError(res, 400, std::string(ids.status().message()));
    return;
  }
  if (ids->empty()) {
    engine->metrics().RecordRejected();
    ReplyError(res, 400, "messages: the chat template rendered no text");
    return;
  }
  inference::GenerationRequest g;
  g.prompt = std::move(*ids);
  g.deadline = hooks_.deadline();
  // Unset: as much as the context leaves (at least one, so a prompt that
  // fills it is refused by the engine, naming the context).
  g.max_new_tokens =
      parsed->max_tokens.has_value()
          ? *parsed->max_tokens
          : std::max<int64_t>(1, engine->options().max_positions -
                                     static_cast<int64_t>(g.prompt.size()));
  g.sampling.temperature = parsed->temperature;
  g.sampling.top_k = parsed->top_k;
  g.sampling.top_p = parsed->top_p >= 1 ? 0.0 : parsed->top_p;
  g.sampling.seed =
      parsed->seed.has_value() ? *parsed->seed : hooks_.next_seed();
  g.stop = parsed->stop;
  g.stop.insert(g.stop.end(), end_of_turn_.begin(), end_of_turn_.end());
  g.stop_at_eod = true;
  auto gen = std::make_shared<Generation>();
  gen->engine = engine;
  gen->prompt_tokens = static_cast<int64_t>(g.prompt.size());
  std::shared_ptr<Events> events = gen->events;
  auto id = engine->Submit(
      std::move(g), [events](const GenerationEvent& e) { events->Push(e); });
  if (!id.ok()) {
    const int status = absl::IsInvalidArgument(id.status())     ? 400
                       : absl::IsResourceExhausted(id.status()) ? 429
                                                                : 503;
    ReplyError(res, status, std::string(id.status().message()));
    return;
  }
  gen->id = *id;
  const std::string chat_id = absl::StrCat("chatcmpl-", next_id_.fetch_add(1));
  const int64_t created = absl::ToUnixSeconds(absl::Now());
  const std::string model =
      parsed->model.empty() ? hooks_.model_name : parsed->model;
  const absl::Duration timeout = hooks_.request_timeout;
  auto timeout_message = [timeout] {
    return absl::StrCat(
        "the generation did not finish within the server's "
        "--request-timeout of ",
        absl::FormatDuration(timeout));
  };
  if (!parsed->stream) {
    GenerationEvent last;
    while (!last.finished) {
      if (GuardedServer::ClientLeft()) {
        engine->Cancel(gen->id);
        return;
      }
      for (GenerationEvent& e : events->Take(absl::Milliseconds(100))) {
        if (e.finished) last = std::move(e);
      }
    }
    if (last.finish_reason == inference::FinishReason::kTimeout) {
      ReplyError(res, 504, timeout_message());
      return;
    }
    if (last.finish_reason == inference::FinishReason::kCancelled) {
      ReplyError(res, 503, "the server stopped before the generation ended");
      return;
    }
    Reply(res, 200,
          ChatCompletionResponse(
              chat_id, created, model, last.text,
              inference::FinishReasonName(last.finish_reason),
              gen->prompt_tokens, static_cast<int64_t>(last.tokens.size())));
    return;
  }
  // Streamed: the role first, a content delta per token, the finish reason,
  // the usage when asked for, then [DONE].
  const bool include_usage = parsed->include_usage;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [gen, chat_id, created, model, include_usage](size_t,
                                                    httplib::DataSink& sink) {
        if (!sink.is_writable()) {
          gen->engine->Cancel(gen->id);
          return false;
        }
        std::string chunk;
        for (const GenerationEvent& e :
             gen->events->Take(absl::Milliseconds(100))) {
          // The first chunk carries the role; then one per text delta.
          if (gen->first || !e.text_delta.empty()) {
            absl::StrAppend(&chunk,
                            ChatStreamEvent(chat_id, created, model, gen->first,
                                            e.text_delta, ""));
            gen->first = false;
          }
          if (e.finished) {
            absl::StrAppend(
                &chunk,
                ChatStreamEvent(chat_id, created, model, false, "",
                                inference::FinishReasonName(e.finish_reason)));
            if (include_usage) {
              absl::StrAppend(&chunk,
                              ChatStreamUsageEvent(
                                  chat_id, created, model, gen->prompt_tokens,
                                  static_cast<int64_t>(e.tokens.size())));
            }
            absl::StrAppend(&chunk, kStreamDone);
            gen->finished = true;
          }
        }
        if (!chunk.empty() && !sink.write(chunk.data(), chunk.size())) {
          gen->engine->Cancel(gen->id);
          return false;
        }
        if (gen->finished) sink.done();
        return true;
      },
      [gen](bool success) {
        if (!success && !gen->finished) gen->engine->Cancel(gen->id);
      });
}

}  // namespace serve
}  // namespace mcc
