#ifndef TOOLS_SERVE_COMPLETIONS_API_H_
#define TOOLS_SERVE_COMPLETIONS_API_H_

// OpenAI-style completions (POST /v1/completions): the request's fields and
// checks, the answer, and the server-sent events of a streamed answer.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace serve {

struct CompletionRequest {
  std::vector<std::string> prompts;  // "prompt": a string or a list of them
  int64_t max_tokens = 16;           // >= 1
  double temperature = 1.0;          // [0, 2]; 0 is greedy
  double top_p = 1.0;                // (0, 1]
  int top_k = 0;                     // An extension: 0 is all.
  std::vector<std::string> stop;     // A string or up to 4
  std::optional<uint64_t> seed;
  bool stream = false;
  std::optional<int> logprobs;  // Log-probabilities of the chosen tokens.
  bool ignore_eos = false;      // An extension: run past end of document.
  std::string model;
};

// Parses and checks a request body; errors (InvalidArgument) name the field.
// Never throws.
absl::StatusOr<CompletionRequest> ParseCompletionRequest(
    absl::string_view body);

struct CompletionChoice {
  std::string text;
  std::vector<std::string> token_texts;  // With logprobs.
  std::vector<double> token_logprobs;
  std::string finish_reason;  // "stop" or "length"
};

// The whole answer ("object": "text_completion").
std::string CompletionResponse(const std::string& id, int64_t created,
                               const std::string& model,
                               const std::vector<CompletionChoice>& choices,
                               bool logprobs, int64_t prompt_tokens,
                               int64_t completion_tokens);

// One server-sent event: "data: {chunk}\n\n" for choice `index` carrying
// `text` (one token's worth), and finish_reason once it ends (empty: null).
std::string CompletionStreamEvent(const std::string& id, int64_t created,
                                  const std::string& model, int index,
                                  const std::string& text,
                                  const std::string& finish_reason);
// The stream's last event.
inline constexpr char kStreamDone[] = "data: [DONE]\n\n";

// {"error": {"message": ..., "type": ..., "code": status}}
std::string ErrorBody(const std::string& message, int status);

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_COMPLETIONS_API_H_
