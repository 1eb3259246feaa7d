#include "inference/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace mcc {
namespace inference {

int64_t SampleToken(const float* logits, int64_t limit,
                    const SamplingParams& params, std::mt19937_64* rng) {
  if (params.greedy()) {
    return std::max_element(logits, logits + limit) - logits;
  }
  std::vector<int64_t> order(limit);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  int64_t keep = limit;
  if (params.top_k > 0) keep = std::min<int64_t>(keep, params.top_k);
  std::vector<double> probs(keep);
  const double max_logit = logits[order[0]];
  double total = 0;
  for (int64_t i = 0; i < keep; ++i) {
    probs[i] = std::exp((logits[order[i]] - max_logit) / params.temperature);
    total += probs[i];
  }
  if (params.top_p > 0) {
    // The smallest prefix whose probability reaches top_p.
    double cumulative = 0;
    for (int64_t i = 0; i < keep; ++i) {
      cumulative += probs[i] / total;
      if (cumulative >= params.top_p) {
        keep = i + 1;
        break;
      }
    }
    total = std::accumulate(probs.begin(), probs.begin() + keep, 0.0);
  }
  // 53 random bits as a double in [0, total).
  const double u = static_cast<double>((*rng)() >> 11) * 0x1.0p-53 * total;
  double cumulative = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cumulative += probs[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];
}

double TokenLogProb(const float* logits, int64_t limit, int64_t token) {
  const double max_logit = *std::max_element(logits, logits + limit);
  double sum = 0;
  for (int64_t i = 0; i < limit; ++i) sum += std::exp(logits[i] - max_logit);
  return (logits[token] - max_logit) - std::log(sum);
}

}  // namespace inference
}  // namespace mcc
