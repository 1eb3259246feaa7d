#ifndef INFERENCE_GENERATION_REQUEST_H_
#define INFERENCE_GENERATION_REQUEST_H_

// What a client asks the engine for and what it gets back, token by token.

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "inference/sampler.h"

namespace mcc {
namespace inference {

struct GenerationRequest {
  std::vector<int64_t> prompt;  // Token ids; at least one.
  int64_t max_new_tokens = 16;  // 0: only the prompt's log-probabilities.
  SamplingParams sampling;
  std::vector<std::string> stop;  // Stop strings (cut from the text).
  bool stop_at_eod = true;        // The end-of-document token ends it.
  // Log-probabilities of prompt[1..] given what precedes each.
  bool prompt_logprobs = false;
  // Past this the engine ends the request (FinishReason::kTimeout) and frees
  // its blocks, running or waiting.
  absl::Time deadline = absl::InfiniteFuture();
};

enum class FinishReason { kNone, kLength, kStop, kCancelled, kTimeout };
// "length", "stop", "cancelled", "timeout".
const char* FinishReasonName(FinishReason reason);

// One event per generated token, and a last one (finished) that carries the
// whole result. Text is the decoded continuation, cut before a stop string.
struct GenerationEvent {
  bool has_token = false;
  int64_t token = 0;
  double logprob = 0;      // log p(token), before temperature.
  std::string text_delta;  // Text safe to send since the last event.
  bool finished = false;
  // Set on the last event:
  FinishReason finish_reason = FinishReason::kNone;
  std::vector<int64_t> tokens;   // Generated (the end-of-document excluded).
  std::vector<double> logprobs;  // Of `tokens`.
  std::vector<double> prompt_logprobs;  // prompt.size() - 1 values.
  std::string text;
};

// Called on the engine thread; must not block for long nor call the engine.
using GenerationCallback = std::function<void(const GenerationEvent&)>;

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_GENERATION_REQUEST_H_
