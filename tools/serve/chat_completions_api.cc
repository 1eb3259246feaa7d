#include "tools/serve/chat_completions_api.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/serve/json_fields.h"

namespace mcc {
namespace serve {
namespace {

absl::Status Bad(const std::string& m) { return absl::InvalidArgumentError(m); }

// A message's content: a string, or text parts joined.
absl::StatusOr<std::string> Content(const nlohmann::json& content,
                                    const std::string& at) {
  if (content.is_string()) return content.get<std::string>();
  if (content.is_array()) {
    std::string text;
    for (size_t i = 0; i < content.size(); ++i) {
      const nlohmann::json& part = content[i];
      const std::string where = absl::StrCat(at, ".content[", i, "]");
      if (!part.is_object()) return Bad(where + " must be an object");
      auto type = part.find("type");
      if (type == part.end() || !type->is_string() ||
          type->get<std::string>() != "text") {
        return Bad(where + ": only parts of type \"text\" are supported");
      }
      auto t = part.find("text");
      if (t == part.end() || !t->is_string()) {
        return Bad(where + ".text must be a string");
      }
      text += t->get<std::string>();
    }
    return text;
  }
  return Bad(at + ".content must be a string or a list of text parts");
}

}  // namespace

absl::StatusOr<ChatCompletionRequest> ParseChatCompletionRequest(
    absl::string_view body) {
  MCC_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(body));
  ChatCompletionRequest r;
  auto messages = j.find("messages");
  if (messages == j.end() || !messages->is_array() || messages->empty()) {
    return Bad("messages must be a non-empty list");
  }
  if (messages->size() > 1024) return Bad("at most 1024 messages");
  for (size_t i = 0; i < messages->size(); ++i) {
    const nlohmann::json& m = (*messages)[i];
    const std::string at = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(at + " must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string() ||
        role->get<std::string>().empty()) {
      return Bad(at + ".role must be a non-empty string");
    }
    if (m.contains("tool_calls") && !m["tool_calls"].is_null()) {
      return Bad(at + ".tool_calls: tool calls are not supported");
    }
    auto content = m.find("content");
    if (content == m.end() || content->is_null()) {
      return Bad(at + ".content is required");
    }
    MCC_ASSIGN_OR_RETURN(std::string text, Content(*content, at));
    r.messages.push_back({role->get<std::string>(), std::move(text)});
  }
  // max_completion_tokens supersedes max_tokens, as OpenAI's.
  for (const char* name : {"max_tokens", "max_completion_tokens"}) {
    if (!j.contains(name) || j[name].is_null()) continue;
    int64_t n = 0;
    MCC_RETURN_IF_ERROR(ReadInt(j, name, &n));
    if (n < 1) return Bad(absl::StrCat(name, " must be at least 1"));
    r.max_tokens = n;
  }
  MCC_RETURN_IF_ERROR(
      ReadSamplingFields(j, &r.temperature, &r.top_p, &r.top_k, &r.stop));
  for (const std::string& s : r.stop) {
    if (s.empty()) return Bad("stop strings must not be empty");
  }
  if (j.contains("seed") && !j["seed"].is_null()) {
    int64_t seed = -1;
    MCC_RETURN_IF_ERROR(ReadInt(j, "seed", &seed));
    if (seed < 0) return Bad("seed must be an integer >= 0");
    r.seed = static_cast<uint64_t>(seed);
  }
  MCC_RETURN_IF_ERROR(ReadBool(j, "stream", &r.stream));
  auto options = j.find("stream_options");
  if (options != j.end() && !options->is_null()) {
    if (!options->is_object()) return Bad("stream_options must be an object");
    MCC_RETURN_IF_ERROR(ReadBool(*options, "include_usage", &r.include_usage));
  }
  int64_t n = 1;
  MCC_RETURN_IF_ERROR(ReadInt(j, "n", &n));
  if (n != 1) return Bad("n must be 1 (one completion per request)");
  bool logprobs = false;
  MCC_RETURN_IF_ERROR(ReadBool(j, "logprobs", &logprobs));
  if (logprobs) return Bad("logprobs: not supported for chat");
  for (const char* unsupported : {"tools", "functions", "tool_choice"}) {
    auto f = j.find(unsupported);
    if (f != j.end() && !f->is_null() && !(f->is_array() && f->empty()) &&
        !(f->is_string() && f->get<std::string>() == "none")) {
      return Bad(absl::StrCat(unsupported, ": tools are not supported"));
    }
  }
  auto format = j.find("response_format");
  if (format != j.end() && !format->is_null()) {
    if (!format->is_object() || !format->contains("type") ||
        (*format)["type"] != "text") {
      return Bad("response_format: only {\"type\": \"text\"} is supported");
    }
  }
  auto model = j.find("model");
  if (model != j.end() && !model->is_null()) {
    if (!model->is_string()) return Bad("model must be a string");
    r.model = model->get<std::string>();
  }
  return r;
}

std::string ChatCompletionResponse(const std::string& id, int64_t created,
                                   const std::string& model,
                                   const std::string& content,
                                   const std::string& finish_reason,
                                   int64_t prompt_tokens,
                                   int64_t completion_tokens) {
  nlohmann::json out = {
      {"id", id},
      {"object", "chat.completion"},
      {"created", created},
      {"model", model},
      {"system_fingerprint", nullptr},
      {"choices", nlohmann::json::array({{{"index", 0},
                                          {"message",
                                           {{"role", "assistant"},
                                            {"content", content},
                                            {"refusal", nullptr}}},
                                          {"logprobs", nullptr},
                                          {"finish_reason", finish_reason}}})},
      {"usage",
       {{"prompt_tokens", prompt_tokens},
        {"completion_tokens", completion_tokens},
        {"total_tokens", prompt_tokens + completion_tokens}}}};
  return Dump(out);
}

std::string ChatStreamEvent(const std::string& id, int64_t created,
                            const std::string& model, bool first,
                            const std::string& content,
                            const std::string& finish_reason) {
  nlohmann::json delta = nlohmann::json::object();
  if (first) delta["role"] = "assistant";
  if (first || !content.empty()) delta["content"] = content;
  nlohmann::json choice = {{"index", 0},
                           {"delta", delta},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  nlohmann::json chunk = {{"id", id},
                          {"object", "chat.completion.chunk"},
                          {"created", created},
                          {"model", model},
                          {"system_fingerprint", nullptr},
                          {"choices", nlohmann::json::array({choice})}};
  return absl::StrCat("data: ", Dump(chunk), "\n\n");
}

std::string ChatStreamUsageEvent(const std::string& id, int64_t created,
                                 const std::string& model,
                                 int64_t prompt_tokens,
                                 int64_t completion_tokens) {
  nlohmann::json chunk = {
      {"id", id},
      {"object", "chat.completion.chunk"},
      {"created", created},
      {"model", model},
      {"choices", nlohmann::json::array()},
      {"usage",
       {{"prompt_tokens", prompt_tokens},
        {"completion_tokens", completion_tokens},
        {"total_tokens", prompt_tokens + completion_tokens}}}};
  return absl::StrCat("data: ", Dump(chunk), "\n\n");
}

std::string ModelsResponse(const std::string& model, int64_t created) {
  nlohmann::json out = {
      {"object", "list"},
      {"data", nlohmann::json::array({{{"id", model},
                                       {"object", "model"},
                                       {"created", created},
                                       {"owned_by", "megatron_cpp"}}})}};
  return Dump(out);
}

}  // namespace serve
}  // namespace mcc
