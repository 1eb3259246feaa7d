#ifndef TOOLS_SERVE_MEGATRON_API_H_
#define TOOLS_SERVE_MEGATRON_API_H_

// Megatron-LM's text-generation REST API (PUT /api): the request's fields and
// checks, and the answer's shape (text, segments, logprobs, tokens per
// prompt), as Megatron's text_generation_server answers.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace mcc {
namespace serve {

struct MegatronRequest {
  std::vector<std::string> prompts;
  int64_t tokens_to_generate = 64;
  double temperature = 1.0;  // (0, 100]
  int top_k = 0;             // [0, 1000]; 1 is greedy
  double top_p = 0.0;        // [0, 1]; not with top_k
  std::optional<int64_t> random_seed;
  bool logprobs = false;
  bool add_BOS = false;
};

// Parses and checks a request body; errors (InvalidArgument) say which field
// is missing or wrong, in words a client can act on. Never throws.
absl::StatusOr<MegatronRequest> ParseMegatronRequest(absl::string_view body);

// One prompt's outcome.
struct MegatronResult {
  std::string prompt;
  std::vector<int64_t> tokens;        // Prompt (with BOS) then generated.
  std::vector<std::string> segments;  // Each token's text.
  std::vector<double> logprobs;       // tokens.size() - 1 values.
  std::string generated_text;
};

// The answer body: {"text": [...], "segments": [...], "tokens": [...]} and
// "logprobs" when asked for. Invalid UTF-8 in generated text is replaced.
std::string MegatronResponse(const std::vector<MegatronResult>& results,
                             bool logprobs);

}  // namespace serve
}  // namespace mcc

#endif  // TOOLS_SERVE_MEGATRON_API_H_
