#ifndef PLANNER_HF_CONFIG_H_
#define PLANNER_HF_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "models/gpt/gpt_config.h"

namespace mcc {
namespace planner {

// The model a Hugging Face config.json describes, for planning: GPT-2
// ("model_type": "gpt2": n_layer, n_embd, n_head, n_inner, n_positions,
// LayerNorm, GELU, biases, tied embeddings) and Llama-style decoders
// ("llama", "mistral", "qwen2": num_hidden_layers, hidden_size,
// num_attention_heads, num_key_value_heads, intermediate_size,
// max_position_embeddings, RMSNorm, SwiGLU, rotary, no linear biases,
// tie_word_embeddings) and their mixtures of experts ("mixtral",
// "qwen2_moe", "qwen3_moe": the experts, top-k, expert ffn, MoE layers and
// shared expert). The sequence length is max positions. `path` names the
// file in errors.
absl::StatusOr<gpt::GPTConfig> GPTConfigFromHuggingFace(
    const std::string& json_text, const std::string& path);
absl::StatusOr<gpt::GPTConfig> ReadHuggingFaceConfig(const std::string& path);

}  // namespace planner
}  // namespace mcc

#endif  // PLANNER_HF_CONFIG_H_
