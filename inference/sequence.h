#ifndef INFERENCE_SEQUENCE_H_
#define INFERENCE_SEQUENCE_H_

// One request's state inside the engine.

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "inference/generation_request.h"
#include "inference/paged_kv_cache.h"
#include "inference/text_stream.h"

namespace mcc {
namespace inference {

struct Sequence {
  Sequence(uint64_t id, GenerationRequest request, GenerationCallback callback)
      : id(id),
        request(std::move(request)),
        callback(std::move(callback)),
        rng(this->request.sampling.seed),
        text(this->request.stop) {
    tokens = this->request.prompt;
  }
  int64_t prompt_len() const {
    return static_cast<int64_t>(request.prompt.size());
  }
  int64_t generated() const {
    return static_cast<int64_t>(tokens.size()) - prompt_len();
  }
  // Positions whose keys and values are in the cache; tokens[computed] is
  // the next to run.
  bool prefilling() const { return computed < prompt_len(); }

  uint64_t id;
  GenerationRequest request;
  GenerationCallback callback;
  std::vector<int64_t> tokens;  // Prompt, then generated.
  int64_t computed = 0;
  BlockTable table;
  std::mt19937_64 rng;
  TextStream text;
  std::vector<double> logprobs, prompt_logprobs;
  absl::Time submitted, last_token;
  bool cancelled = false;
};

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_SEQUENCE_H_
