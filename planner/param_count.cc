#include "planner/param_count.h"

#include "planner/moe_model.h"

namespace mcc {
namespace planner {
namespace {

int64_t NormParams(const gpt::GPTConfig& c) {
  return c.normalization == gpt::Normalization::kLayerNorm ? 2 * c.hidden_size
                                                           : c.hidden_size;
}

ParamCount Count(const gpt::GPTConfig& c, int tp, int64_t vocab_rows) {
  const int64_t h = c.hidden_size;
  const int64_t bias = c.add_bias_linear ? 1 : 0;
  ParamCount p;
  p.layer = 2 * NormParams(c);
  for (const LinearShape& l : LayerLinears(c)) {
    // A column-parallel layer's bias is split with its output; a
    // row-parallel layer's is whole on every rank.
    p.layer += l.OutPerRank(tp) * l.InPerRank(tp) + bias * l.OutPerRank(tp);
  }
  p.embedding = vocab_rows / tp * h;
  if (c.position_embedding == gpt::PositionEmbedding::kLearned) {
    p.embedding += c.max_positions() * h;
  }
  p.final_norm = NormParams(c);
  p.output_layer = vocab_rows / tp * h;
  return p;
}

}  // namespace

std::array<LinearShape, 4> LayerLinears(const gpt::GPTConfig& c) {
  const int64_t h = c.hidden_size, f = c.ffn();
  const int64_t kv = c.query_groups() * c.head_dim();
  const int64_t f1 = c.activation == gpt::Activation::kSwiGLU ? 2 * f : f;
  return {LinearShape{h + 2 * kv, h, true}, LinearShape{h, h, false},
          LinearShape{f1, h, true}, LinearShape{h, f, false}};
}

ParamCount CountParams(const gpt::GPTConfig& config, int tp) {
  return Count(config, tp, config.padded_vocab_size(tp));
}

int64_t StageParams(const gpt::GPTConfig& config, int tp, int pp, int stage,
                    int layers, int head_stage) {
  const ParamCount p = CountParams(config, tp);
  int64_t n = layers * p.layer;
  if (stage == 0) n += p.embedding;
  if (stage == (head_stage < 0 ? pp - 1 : head_stage)) {
    n += p.final_norm;
    if (config.untie_embeddings_and_output_weights || pp > 1) {
      n += p.output_layer;
    }
  }
  return n;
}

int64_t ModelParams(const gpt::GPTConfig& config) {
  const ParamCount p = Count(config, 1, config.vocab_size);
  return config.num_layers * p.layer + MoeModelParamsDelta(config) +
         p.embedding + p.final_norm +
         (config.untie_embeddings_and_output_weights ? p.output_layer : 0);
}

}  // namespace planner
}  // namespace mcc
