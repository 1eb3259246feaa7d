#ifndef CHECKPOINT_HF_LLAMA_H_
#define CHECKPOINT_HF_LLAMA_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/config.pb.h"
#include "checkpoint/safetensors.h"
#include "core/tensor.h"

namespace mcc {

// Maps our Llama-architecture parameters (models/gpt configured with
// RMSNorm, SwiGLU, RoPE, optional GQA, no biases) to Hugging Face's
// LlamaForCausalLM and back. Full unsharded tensors; both sides store
// Linear weights [out, in], so no transposes:
//   embedding.word_embeddings.weight [vocab, h]  model.embed_tokens.weight
//   decoder.layers.{i}.input_layernorm.weight    .input_layernorm.weight
//   decoder.layers.{i}.self_attention.linear_qkv.weight
//       [groups * (heads/groups + 2) * d, h], rows per K/V group g: its
//       heads/groups query heads, then its key head, then its value head
//                                 <-> .self_attn.q_proj [heads * d, h],
//                                     .k_proj, .v_proj [groups * d, h]
//   ...self_attention.linear_proj.weight [h, heads*d]   .self_attn.o_proj
//   decoder.layers.{i}.pre_mlp_layernorm.weight   .post_attention_layernorm
//   decoder.layers.{i}.mlp.linear_fc1.weight [2, ffn, h]: [0] the gate
//       (through SiLU), [1] the up projection  <-> .mlp.gate_proj, .up_proj
//   decoder.layers.{i}.mlp.linear_fc2.weight [h, ffn]   .mlp.down_proj
//   decoder.final_layernorm.weight                model.norm.weight
//   output_layer.weight [vocab, h] (untied only)  lm_head.weight
// (Hugging Face's layer prefix is model.layers.{i}.)
//
// RoPE: both sides rotate a head's dimension i with i + head_dim / 2
// (core/ops/rotary.h; Hugging Face's rotate_half), so Q and K rows keep their
// order within a head; query head j reads K/V head j / (heads / groups) on
// both sides (repeat_kv), so heads map in order.
//
// Mistral (MistralForCausalLM) is Llama's mapping with a sliding window
// (ModelConfig.sliding_window, config.json's sliding_window: the keys a
// query sees, itself included; Megatron's --window-size W - 1,0).
// Qwen2 (Qwen2ForCausalLM) is the same mapping plus the QKV bias
// (add_qkv_bias): decoder.layers.{i}.self_attention.linear_qkv.bias, its
// rows ordered as the weight's <-> .self_attn.q_proj.bias, .k_proj.bias,
// .v_proj.bias. Qwen3 (Qwen3ForCausalLM) adds QK-norm (qk_layernorm):
// decoder.layers.{i}.self_attention.q_layernorm.weight, .k_layernorm.weight
// [head_dim] <-> .self_attn.q_norm.weight, .k_norm.weight.
//
// Llama needs RMSNorm, SwiGLU, rotary positions over the whole head and no
// linear biases but the QKV bias (Qwen2); other configurations are refused,
// naming what differs.
absl::Status CheckLlamaCompatible(const checkpoint::ModelConfig& config);

// Export: the vocabulary tensors keep their first vocab_size rows, so the
// result does not depend on the layout the checkpoint was saved at. Tensors
// keep their dtype.
absl::StatusOr<NamedTensors> ExportLlama(
    const std::map<std::string, Tensor>& params,
    const checkpoint::ModelConfig& config);

// Import: pads the vocabulary with zero rows to StoredVocabRows(config);
// every tensor comes out fp32 (the training dtype of the main parameters;
// bf16 and fp16 files widen exactly). Tensors not in the table (e.g. HF's
// rotary inv_freq buffers) are ignored; a missing tensor or a wrong shape is
// an error naming the tensor.
absl::StatusOr<std::map<std::string, Tensor>> ImportLlama(
    const NamedTensors& hf, const checkpoint::ModelConfig& config);

// The model configuration of a LlamaForCausalLM, MistralForCausalLM,
// Qwen2ForCausalLM or Qwen3ForCausalLM config.json (model_type "llama", the
// default; "mistral": sliding_window, null or absent for none; "qwen2":
// add_qkv_bias; "qwen3": qk_layernorm, head_dim defaulting to 128 as
// Qwen3Config's; Qwen's use_sliding_window true is refused): hidden_size,
// intermediate_size, num_attention_heads, num_hidden_layers, vocab_size,
// max_position_embeddings, and optional num_key_value_heads (default: heads),
// rms_norm_eps (1e-6), rope_theta (10000), tie_word_embeddings (false),
// hidden_act ("silu"), head_dim (hidden / heads), rope_scaling (null, or
// of type "llama3" with factor, low_freq_factor, high_freq_factor and
// original_max_position_embeddings; other types are refused, naming the
// type). Biases (attention_bias, mlp_bias) and other head sizes are refused.
// seq_length is max_position_embeddings. Errors name `path` and the key.
absl::StatusOr<checkpoint::ModelConfig> ParseLlamaConfigJson(
    absl::string_view text, const std::string& path);

// The Hugging Face class a Llama-family configuration exports as:
// Qwen3ForCausalLM with qk_layernorm, Qwen2ForCausalLM with add_qkv_bias,
// MistralForCausalLM with a sliding window, else LlamaForCausalLM (so a
// Mistral without a window, as v0.2 and later, comes back as Llama: the
// same model and tensors).
std::string HfArchitecture(const checkpoint::ModelConfig& config);

// config.json for HfArchitecture(config) (model_type "llama", "mistral",
// "qwen2" or "qwen3"),
// from our model configuration; torch_dtype names `dtype`.
std::string LlamaConfigJson(const checkpoint::ModelConfig& config, DType dtype);

// Reads every parameter of a sharded checkpoint (any layout) whole and maps
// it with ExportLlama under the checkpoint's own ModelConfig. Tensors the
// mapping does not use (optimizer state, ...) are skipped.
absl::StatusOr<NamedTensors> ExportCheckpointToHfLlama(
    CheckpointReader& reader);

}  // namespace mcc

#endif  // CHECKPOINT_HF_LLAMA_H_
