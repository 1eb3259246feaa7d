#ifndef CHECKPOINT_HF_GPT2_H_
#define CHECKPOINT_HF_GPT2_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/checkpoint_reader.h"
#include "checkpoint/config.pb.h"
#include "checkpoint/safetensors.h"
#include "core/tensor.h"

namespace mcc {

// Maps our GPT parameters to Hugging Face's GPT2LMHeadModel and back.
//
// Our names (Megatron-core's), full unsharded tensors, Linear weights stored
// [out, in]:
//   embedding.word_embeddings.weight        [vocab, hidden]
//   embedding.position_embeddings.weight    [max_positions, hidden]
//   decoder.layers.{i}.input_layernorm.weight/bias          [hidden]
//   decoder.layers.{i}.self_attention.linear_qkv.weight     [3*hidden, hidden]
//   decoder.layers.{i}.self_attention.linear_qkv.bias       [3*hidden]
//       rows interleaved per head: [heads, 3 (q,k,v), head_dim]
//   decoder.layers.{i}.self_attention.linear_proj.weight    [hidden, hidden]
//   decoder.layers.{i}.self_attention.linear_proj.bias      [hidden]
//   decoder.layers.{i}.pre_mlp_layernorm.weight/bias        [hidden]
//   decoder.layers.{i}.mlp.linear_fc1.weight/bias           [ffn, hidden]/[ffn]
//   decoder.layers.{i}.mlp.linear_fc2.weight/bias           [hidden,
//   ffn]/[hidden] decoder.final_layernorm.weight/bias [hidden]
//   output_layer.weight                      [vocab, hidden], untied
//   only
// Hugging Face's (Conv1D weights stored [in, out], i.e. transposed):
//   transformer.wte.weight [vocab, hidden], transformer.wpe.weight,
//   transformer.h.{i}.ln_1, .attn.c_attn [hidden, 3*hidden] (columns q|k|v,
//   each [heads, head_dim]), .attn.c_proj, .ln_2, .mlp.c_fc [hidden, ffn],
//   .mlp.c_proj [ffn, hidden], transformer.ln_f, lm_head.weight (untied only).
//
// GPT-2 needs learned absolute positions, LayerNorm, GELU, biases and
// num_query_groups == num_attention_heads; other configurations are refused.
absl::Status CheckGpt2Compatible(const checkpoint::ModelConfig& config);

// ("vocab" is StoredVocabRows(config): the true vocabulary, or the padded
// rows of checkpoints written before the TP padding left the model.)
//
// Export: the vocabulary tensors keep their first config.vocab_size rows, so
// the result does not depend on the layout the checkpoint was saved at.
absl::StatusOr<NamedTensors> ExportGpt2(
    const std::map<std::string, Tensor>& params,
    const checkpoint::ModelConfig& config);

// Import: accepts names with or without the "transformer." prefix (the Hub's
// files use both); pads the vocabulary with zero rows to StoredVocabRows
// (none when padded_vocab_size is unset or equals vocab_size).
absl::StatusOr<std::map<std::string, Tensor>> ImportGpt2(
    const NamedTensors& hf, const checkpoint::ModelConfig& config);

// The model configuration of a Hugging Face GPT-2 config.json (vocab_size,
// n_embd, n_layer, n_head, n_positions, optional n_inner,
// layer_norm_epsilon and tie_word_embeddings, true when absent). Sizes must
// be positive 32-bit integers; an error names `path` and the key at fault.
// ImportGpt2 checks the rest (CheckGpt2Compatible, the tensors' shapes).
absl::StatusOr<checkpoint::ModelConfig> ParseGpt2ConfigJson(
    absl::string_view text, const std::string& path);

// Reads every parameter of a sharded checkpoint (any layout) whole and maps
// it with ExportGpt2 under the checkpoint's own ModelConfig.
absl::StatusOr<NamedTensors> ExportCheckpointToGpt2Tensors(
    CheckpointReader& reader);

// Reads every parameter of a sharded checkpoint (any layout) whole, maps it
// with ExportGpt2 under the checkpoint's own ModelConfig and writes a
// safetensors file for GPT2LMHeadModel. Tensors the mapping does not use
// (optimizer state, ...) are skipped.
absl::Status ExportCheckpointToHfGpt2(CheckpointReader& reader,
                                      const std::string& path);

}  // namespace mcc

#endif  // CHECKPOINT_HF_GPT2_H_
