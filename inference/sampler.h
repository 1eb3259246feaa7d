#ifndef INFERENCE_SAMPLER_H_
#define INFERENCE_SAMPLER_H_

// Choosing the next token from a row of logits, per request: each request
// owns its random generator, so the tokens it draws depend only on its own
// seed and logits, never on the requests batched with it.

#include <cstdint>
#include <random>

namespace mcc {
namespace inference {

struct SamplingParams {
  // 0 is greedy (the most likely token); top_k 1 is greedy too.
  double temperature = 1.0;
  int top_k = 0;       // Sample among the k most likely (0: all).
  double top_p = 0.0;  // Among the most likely summing to p (0: all).
  uint64_t seed = 0;
  bool greedy() const { return temperature == 0 || top_k == 1; }
};

// The next token from fp32 logits (only ids below `limit`, the tokenizer's
// vocabulary, can win). Greedy takes the first maximum; sampling draws one
// 53-bit uniform from *rng. Deterministic for a given rng state.
int64_t SampleToken(const float* logits, int64_t limit,
                    const SamplingParams& params, std::mt19937_64* rng);

// log softmax(logits[0 .. limit))[token], in double (the model's
// probability, before temperature and truncation, as Megatron reports it).
double TokenLogProb(const float* logits, int64_t limit, int64_t token);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_SAMPLER_H_
