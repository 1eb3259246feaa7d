#include "tools/serve/megatron_api.h"

#include "absl/strings/str_cat.h"
#include "core/status_macros.h"
#include "nlohmann/json.hpp"
#include "tools/serve/json_fields.h"

namespace mcc {
namespace serve {

absl::StatusOr<MegatronRequest> ParseMegatronRequest(absl::string_view body) {
  MCC_ASSIGN_OR_RETURN(nlohmann::json j, ParseJsonObject(body));
  auto bad = [](std::string m) { return absl::InvalidArgumentError(m); };
  // Fields Megatron once had: say what replaced them.
  if (j.contains("max_len")) {
    return bad("max_len is no longer accepted: use tokens_to_generate");
  }
  if (j.contains("sentences")) {
    return bad("sentences is no longer accepted: use prompts");
  }
  if (j.contains("beam_width")) return bad("beam search is not supported");
  MegatronRequest r;
  auto prompts = j.find("prompts");
  if (prompts == j.end()) return bad("prompts is required");
  if (!prompts->is_array()) return bad("prompts must be a list of strings");
  if (prompts->empty()) return bad("prompts is empty");
  if (prompts->size() > 128) return bad("at most 128 prompts per request");
  for (const auto& p : *prompts) {
    if (!p.is_string()) return bad("prompts must be a list of strings");
    r.prompts.push_back(p.get<std::string>());
  }
  MCC_RETURN_IF_ERROR(ReadInt(j, "tokens_to_generate", &r.tokens_to_generate));
  if (r.tokens_to_generate < 0) {
    return bad("tokens_to_generate must be an integer >= 0");
  }
  MCC_RETURN_IF_ERROR(ReadBool(j, "logprobs", &r.logprobs));
  if (r.tokens_to_generate == 0 && !r.logprobs) {
    return bad("tokens_to_generate 0 needs logprobs true (nothing to do)");
  }
  MCC_RETURN_IF_ERROR(ReadNumber(j, "temperature", &r.temperature));
  if (!(r.temperature > 0 && r.temperature <= 100)) {
    return bad("temperature must be a number in (0, 100] (top_k 1 is greedy)");
  }
  int64_t top_k = 0;
  MCC_RETURN_IF_ERROR(ReadInt(j, "top_k", &top_k));
  if (top_k < 0 || top_k > 1000) return bad("top_k must be in [0, 1000]");
  r.top_k = static_cast<int>(top_k);
  MCC_RETURN_IF_ERROR(ReadNumber(j, "top_p", &r.top_p));
  if (r.top_p < 0 || r.top_p > 1) return bad("top_p must be in [0, 1]");
  if (r.top_p > 0 && r.top_k > 0) {
    return bad("top_k and top_p cannot both be set");
  }
  MCC_RETURN_IF_ERROR(ReadBool(j, "add_BOS", &r.add_BOS));
  for (const std::string& p : r.prompts) {
    if (p.empty() && !r.add_BOS)
      return bad("an empty prompt needs add_BOS true");
  }
  int64_t seed = -1;
  MCC_RETURN_IF_ERROR(ReadInt(j, "random_seed", &seed));
  if (j.contains("random_seed") && !j["random_seed"].is_null()) {
    if (seed < 0) return bad("random_seed must be an integer >= 0");
    r.random_seed = seed;
  }
  return r;
}

std::string MegatronResponse(const std::vector<MegatronResult>& results,
                             bool logprobs) {
  nlohmann::json text = nlohmann::json::array();
  nlohmann::json segments = nlohmann::json::array();
  nlohmann::json tokens = nlohmann::json::array();
  nlohmann::json probs = nlohmann::json::array();
  for (const MegatronResult& r : results) {
    text.push_back(r.prompt + r.generated_text);
    segments.push_back(r.segments);
    tokens.push_back(r.tokens);
    probs.push_back(r.logprobs);
  }
  nlohmann::json out = {
      {"text", text}, {"segments", segments}, {"tokens", tokens}};
  if (logprobs) out["logprobs"] = probs;
  return Dump(out);
}

}  // namespace serve
}  // namespace mcc
