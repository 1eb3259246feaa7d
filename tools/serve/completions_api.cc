#include "tools/serve/completions_api.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/serve/json_fields.h"

namespace mcc {
namespace serve {

absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    absl::string_view body) {
  MCC_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(body));
  auto bad = [](std::string m) { return absl::InvalidArgumentError(m); };
  CompletionRequest r;
  auto prompt = j.find("prompt");
  if (prompt == j.end() || prompt->is_null()) return bad("prompt is required");
  if (prompt->is_string()) {
    r.prompts.push_back(prompt->get<std::string>());
  } else if (prompt->is_array() && !prompt->empty()) {
    for (const auto& p : *prompt) {
      if (!p.is_string()) {
        return bad("prompt must be a string or a list of strings");
      }
      r.prompts.push_back(p.get<std::string>());
    }
    if (r.prompts.size() > 128) return bad("at most 128 prompts per request");
  } else {
    return bad("prompt must be a string or a non-empty list of strings");
  }
  MCC_RETURN_IF_ERROR(ReadInt(j, "max_tokens", &r.max_tokens));
  if (r.max_tokens < 1) return bad("max_tokens must be at least 1");
  MCC_RETURN_IF_ERROR(
      ReadSamplingFields(j, &r.temperature, &r.top_p, &r.top_k, &r.stop));
  int64_t seed = -1;
  MCC_RETURN_IF_ERROR(ReadInt(j, "seed", &seed));
  if (j.contains("seed") && !j["seed"].is_null()) {
    if (seed < 0) return bad("seed must be an integer >= 0");
    r.seed = static_cast<uint64_t>(seed);
  }
  MCC_RETURN_IF_ERROR(ReadBool(j, "stream", &r.stream));
  MCC_RETURN_IF_ERROR(ReadBool(j, "ignore_eos", &r.ignore_eos));
  auto logprobs = j.find("logprobs");
  if (logprobs != j.end() && !logprobs->is_null()) {
    int64_t n = 0;
    MCC_RETURN_IF_ERROR(ReadInt(j, "logprobs", &n));
    if (n < 0 || n > 5) return bad("logprobs must be an integer in [0, 5]");
    r.logprobs = static_cast<int>(n);
  }
  int64_t choices = 1;
  MCC_RETURN_IF_ERROR(ReadInt(j, "n", &choices));
  if (choices != 1) return bad("n must be 1 (one completion per prompt)");
  auto model = j.find("model");
  if (model != j.end() && !model->is_null()) {
    if (!model->is_string()) return bad("model must be a string");
    r.model = model->get<std::string>();
  }
  return r;
}

std::string CompletionResponse(const std::string& id, int64_t created,
                               const std::string& model,
                               const std::vector<CompletionChoice>& choices,
                               bool logprobs, int64_t prompt_tokens,
                               int64_t completion_tokens) {
  nlohmann::json list = nlohmann::json::array();
  for (size_t i = 0; i < choices.size(); ++i) {
    const CompletionChoice& c = choices[i];
    nlohmann::json choice = {{"text", c.text},
                             {"index", i},
                             {"logprobs", nullptr},
                             {"finish_reason", c.finish_reason}};
    if (logprobs) {
      nlohmann::json offsets = nlohmann::json::array();
      size_t offset = 0;
      for (const std::string& t : c.token_texts) {
        offsets.push_back(offset);
        offset += t.size();
      }
      choice["logprobs"] = {{"tokens", c.token_texts},
                            {"token_logprobs", c.token_logprobs},
                            {"top_logprobs", nullptr},
                            {"text_offset", offsets}};
    }
    list.push_back(choice);
  }
  nlohmann::json out = {
      {"id", id},
      {"object", "text_completion"},
      {"created", created},
      {"model", model},
      {"choices", list},
      {"usage",
       {{"prompt_tokens", prompt_tokens},
        {"completion_tokens", completion_tokens},
        {"total_tokens", prompt_tokens + completion_tokens}}}};
  return Dump(out);
}

std::string CompletionStreamEvent(const std::string& id, int64_t created,
                                  const std::string& model, int index,
                                  const std::string& text,
                                  const std::string& finish_reason) {
  nlohmann::json choice = {{"text", text},
                           {"index", index},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}};
  if (!finish_reason.empty()) choice["finish_reason"] = finish_reason;
  nlohmann::json chunk = {{"id", id},
                          {"object", "text_completion"},
                          {"created", created},
                          {"model", model},
                          {"choices", nlohmann::json::array({choice})}};
  return absl::StrCat("data: ", Dump(chunk), "\n\n");
}

std::string ErrorBody(const std::string& message, int status) {
  nlohmann::json out = {
      {"error",
       {{"message", message},
        {"type", status >= 500 ? "server_error" : "invalid_request_error"},
        {"code", status}}}};
  return Dump(out);
}

}  // namespace serve
}  // namespace mcc
