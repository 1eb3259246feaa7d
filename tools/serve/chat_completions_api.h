#ifndef TOOLS_SERVE_CHAT_COMPLETIONS_API_H_
#define TOOLS_SERVE_CHAT_COMPLETIONS_API_H_

// OpenAI-style chat (POST /v1/chat/completions) and the model list
// (GET /v1/models): the request's fields and checks, the answer, and the
// server-sent events of a streamed answer, in the shapes the official
// clients parse.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "data/chat_template.h"

namespace mcc {
namespace serve {

struct ChatCompletionRequest {
  // "messages": role and content (a string, or a list of {"type": "text",
  // "text": ...} parts, joined); at least one, at most 1024.
  std::vector<data::ChatMessage> messages;
  // "max_completion_tokens", or the older "max_tokens"; >= 1. Unset: up to
  // the model's context.
  std::optional<int64_t> max_tokens;
  double temperature = 1.0;       // [0, 2]; 0 is greedy
  double top_p = 1.0;             // (0, 1]
  int top_k = 0;                  // An extension: 0 is all.
  std::vector<std::string> stop;  // A string or up to 4
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;
};

// Parses and checks a request body; errors (InvalidArgument) name the field.
// Never throws. Fields the server does not implement with another value than
// their default (n != 1, logprobs, tools, response_format other than text)
// are refused by name.
absl::StatusOr<ChatCompletionRequest> ParseChatCompletionRequest(
    absl::string_view body);

// The whole answer ("object": "chat.completion").
std::string ChatCompletionResponse(const std::string& id, int64_t created,
                                   const std::string& model,
                                   const std::string& content,
                                   const std::string& finish_reason,
                                   int64_t prompt_tokens,
                                   int64_t completion_tokens);

// One server-sent event ("object": "chat.completion.chunk"): the first
// carries the role, the others a content delta; finish_reason (empty: null)
// on the last.
std::string ChatStreamEvent(const std::string& id, int64_t created,
                            const std::string& model, bool first,
                            const std::string& content,
                            const std::string& finish_reason);
// The usage chunk that stream_options.include_usage asks for (no choices).
std::string ChatStreamUsageEvent(const std::string& id, int64_t created,
                                 const std::string& model,
                                 int64_t prompt_tokens,
                                 int64_t completion_tokens);

// GET /v1/models: {"object": "list", "data": [{"id": model, ...}]}.
std::string ModelsResponse(const std::string& model, int64_t created);

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_CHAT_COMPLETIONS_API_H_
