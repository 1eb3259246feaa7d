#include "models/gpt/model_flops.h"

#include <algorithm>

namespace mcc {
namespace gpt {

double TrainingFlopsPerToken(const GPTConfig& c) {
  const double h = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim());
  const double kv = static_cast<double>(c.query_groups()) * d;
  const bool swiglu = c.activation == Activation::kSwiGLU;
  // Multiply-adds per token of an MLP of hidden size f: in and out.
  auto mlp = [&](double f) { return h * (swiglu ? 2 * f : f) + f * h; };
  // An MoE layer's token goes through its top-k experts and the shared
  // expert (the router's small GEMM is left out, as Megatron does).
  const double moe_mlp =
      c.num_experts > 0
          ? c.moe_router_topk * mlp(static_cast<double>(c.moe_ffn())) +
                mlp(static_cast<double>(c.moe_shared_expert_intermediate_size))
          : 0.0;
  // QKV and output projection.
  const double attention_gemm = h * (h + 2 * kv) + h * h;
  // Attention scores and weighted values over the sequence.
  const double attention = 2.0 * c.seq_length * h;
  double layers = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    layers += attention_gemm + attention +
              (c.IsMoeLayer(i) ? moe_mlp : mlp(static_cast<double>(c.ffn())));
  }
  const double forward = 2.0 * (layers + h * static_cast<double>(c.vocab_size));
  return 3.0 * forward;
}

double AttentionTrainingFlopsPerToken(const GPTConfig& c) {
  // 2 s h multiply-adds a layer, forward; backward twice the forward.
  return 3.0 * 2.0 * c.num_layers * (2.0 * c.seq_length * c.hidden_size);
}

int64_t CausalAttentionPairs(const int32_t* document_start, int64_t b,
                             int64_t s, int64_t window_left) {
  int64_t pairs = 0;
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < s; ++i) {
      int64_t first =
          document_start != nullptr ? document_start[bi * s + i] : 0;
      if (window_left >= 0) first = std::max(first, i - window_left);
      pairs += i - std::clamp<int64_t>(first, 0, i) + 1;
    }
  }
  return pairs;
}

int64_t FullCausalAttentionPairs(int64_t b, int64_t s) {
  return b * (s * (s + 1) / 2);
}

double TrainingFlops(const GPTConfig& config, double tokens,
                     double attention_fraction) {
  return tokens *
         (TrainingFlopsPerToken(config) -
          (1.0 - attention_fraction) * AttentionTrainingFlopsPerToken(config));
}

}  // namespace gpt
}  // namespace mcc
