#include "models/gpt/model_flops.h"

namespace mcc {
namespace gpt {

double TrainingFlopsPerToken(const GPTConfig& c) {
  const double h = static_cast<double>(c.hidden_size);
  const double d = static_cast<double>(c.head_dim());
  const double kv = static_cast<double>(c.query_groups()) * d;
  const double ffn = static_cast<double>(c.ffn());
  const double mlp_in = c.activation == Activation::kSwiGLU ? 2 * ffn : ffn;
  // Multiply-adds per token: QKV, output projection, MLP in and out.
  const double gemm = h * (h + 2 * kv) + h * h + h * mlp_in + ffn * h;
  // Attention scores and weighted values over the sequence.
  const double attention = 2.0 * c.seq_length * h;
  const double forward = 2.0 * (c.num_layers * (gemm + attention) +
                                h * static_cast<double>(c.vocab_size));
  return 3.0 * forward;
}

}  // namespace gpt
}  // namespace mcc
