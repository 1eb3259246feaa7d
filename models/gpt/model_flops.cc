#include "models/gpt/model_flops.h"

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

}  // namespace gpt
}  // namespace mcc
