#ifndef MODELS_GPT_GPT_CONFIG_H_
#define MODELS_GPT_GPT_CONFIG_H_

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/ops/moe_router.h"
#include "core/ops/rotary.h"

namespace mcc {
namespace gpt {

enum class PositionEmbedding { kLearned, kRope };
enum class Normalization { kLayerNorm, kRMSNorm };
enum class Activation { kGelu, kSwiGLU };
enum class RecomputeGranularity { kNone, kSelective, kFull };
enum class RecomputeMethod { kUniform, kBlock };
enum class MoeLoadBalancing { kNone, kAuxLoss, kSeqAuxLoss };

// The model's shape and options, with Megatron's flag names beside each.
struct GPTConfig {
  int num_layers = 2;           // --num-layers
  int64_t hidden_size = 64;     // --hidden-size
  int num_attention_heads = 4;  // --num-attention-heads
  int num_query_groups = 0;     // --num-query-groups (GQA); 0: heads
  int64_t ffn_hidden_size = 0;  // --ffn-hidden-size; 0: 4 * hidden
  int64_t vocab_size = 128;     // the tokenizer's vocabulary
  // --make-vocab-size-divisible-by: the embedding and output layer hold
  // rows padded to a multiple of this times TP. The padding is not part of
  // the model: its rows are zero and its logits take no probability.
  int64_t make_vocab_size_divisible_by = 1;
  int64_t seq_length = 32;              // --seq-length
  int64_t max_position_embeddings = 0;  // 0: seq_length
  PositionEmbedding position_embedding = PositionEmbedding::kLearned;
  double rotary_base = 10000.0;  // --rotary-base
  // Llama 3.x's frequency rescaling: --use-rope-scaling with
  // --rope-scaling-factor (Megatron's) and our --rope-scaling-low-freq-factor,
  // --rope-scaling-high-freq-factor and
  // --rope-scaling-original-max-position-embeddings (Megatron fixes those
  // three at 1, 4 and 8192).
  ops::Llama3RopeScaling rope_scaling;
  Normalization normalization = Normalization::kLayerNorm;  // --normalization
  double norm_epsilon = 1e-5;                               // --norm-epsilon
  Activation activation = Activation::kGelu;  // --swiglu selects SwiGLU
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // --disable-bias-linear clears it
  // --add-qkv-bias: the QKV projection keeps its bias when
  // --disable-bias-linear removes the others (Qwen2).
  bool add_qkv_bias = false;
  // --qk-layernorm: Q and K normalised over each head (the model's
  // --normalization, weights of head_dim shared by the heads) before the
  // rotation (Qwen3).
  bool qk_layernorm = false;
  // Sliding-window attention (Megatron's --window-size L,0; Mistral's
  // sliding_window = L + 1): each query sees itself and the L keys before
  // it. -1: no window.
  int64_t window_left = -1;
  double hidden_dropout = 0.0;     // --hidden-dropout
  double attention_dropout = 0.0;  // --attention-dropout
  double init_method_std = 0.02;   // --init-method-std
  uint64_t seed = 1234;            // --seed
  RecomputeGranularity recompute_granularity = RecomputeGranularity::kNone;
  RecomputeMethod recompute_method = RecomputeMethod::kUniform;
  int recompute_num_layers = 1;  // --recompute-num-layers
  // --cpu-offloading: between forward and backward, the activations each
  // model chunk's first cpu_offloading_num_layers layers save (a
  // recomputed layer: its input) wait in pinned host memory, moved on a
  // side stream (core/activation_offload.h). Refused on the CPU device.
  bool cpu_offloading = false;
  int cpu_offloading_num_layers = 0;  // --cpu-offloading-num-layers

  // Mixture of experts (issue 41): the layers moe_layer_freq picks replace
  // their MLP by a router over num_experts experts (models/moe/moe_mlp.h);
  // 0 experts: a dense model.
  int num_experts = 0;               // --num-experts
  int moe_router_topk = 2;           // --moe-router-topk
  int64_t moe_ffn_hidden_size = 0;   // --moe-ffn-hidden-size; 0: ffn()
  std::string moe_layer_freq = "1";  // --moe-layer-freq (moe_layer_pattern.h)
  // --moe-shared-expert-intermediate-size; 0: no shared expert.
  int64_t moe_shared_expert_intermediate_size = 0;
  // --moe-shared-expert-gate: the shared expert's output times
  // sigmoid(x . w_g) (Qwen2-MoE's shared_expert_gate).
  bool moe_shared_expert_gate = false;
  // --moe-router-pre-softmax: the combine weights are the softmax over all
  // experts' logits, not renormalised over the top-k (Qwen2-MoE's
  // norm_topk_prob false).
  bool moe_router_pre_softmax = false;
  ops::MoeScoreFunction moe_router_score_function =
      ops::MoeScoreFunction::kSoftmax;  // --moe-router-score-function
  // --moe-router-load-balancing-type, with --moe-aux-loss-coeff.
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::kAuxLoss;
  double moe_aux_loss_coeff = 0.0;  // --moe-aux-loss-coeff
  double moe_z_loss_coeff = 0.0;    // --moe-z-loss-coeff
  // --moe-router-enable-expert-bias (DeepSeek-V3's aux-loss-free balance),
  // stepped by --moe-router-bias-update-rate after each optimizer step.
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  // --moe-expert-capacity-factor (0: dropless) and --moe-token-drop-policy
  // (probs or position; models/moe/token_drop.h), during training.
  double moe_expert_capacity_factor = 0.0;
  std::string moe_token_drop_policy = "probs";

  int64_t ffn() const {
    return ffn_hidden_size > 0 ? ffn_hidden_size : 4 * hidden_size;
  }
  int query_groups() const {
    return num_query_groups > 0 ? num_query_groups : num_attention_heads;
  }
  bool qkv_bias() const { return add_bias_linear || add_qkv_bias; }
  int64_t head_dim() const { return hidden_size / num_attention_heads; }
  int64_t moe_ffn() const {
    return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn();
  }
  // Whether layer i (0-based, global) is a mixture of experts; false for
  // every layer of a dense model or an invalid moe_layer_freq (Validate
  // refuses that).
  bool IsMoeLayer(int layer) const;
  bool sliding_window() const { return window_left >= 0; }
  // The rotation every layer applies to Q and K (base, Llama 3 scaling).
  ops::RotaryOptions Rotary() const {
    ops::RotaryOptions options;
    options.base = rotary_base;
    options.llama3 = rope_scaling;
    return options;
  }
  int64_t max_positions() const {
    return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
  }
  // Rows of the word embedding and output layer under TP size tp.
  int64_t padded_vocab_size(int tensor_parallel_size) const {
    const int64_t multiple =
        std::max<int64_t>(1, make_vocab_size_divisible_by) *
        std::max(1, tensor_parallel_size);
    return (vocab_size + multiple - 1) / multiple * multiple;
  }

  // The architecture in words, for logs: "Llama (RMSNorm, SwiGLU, RoPE,
  // GQA 4/2, untied, no bias)" when every Llama choice is made (the family
  // of Llama 2/3 and Mistral), "GPT" for GPT-2's choices, and otherwise
  // "GPT (" plus the choices that differ from GPT-2's ")".
  std::string Architecture() const;
  // Whether every Llama choice is made: RMSNorm, SwiGLU, rotary positions,
  // untied output layer, no linear biases (GQA optional).
  bool IsLlama() const;

  // Checks the shape against itself and against the tensor-parallel size
  // (and sequence parallelism); the message names the flags at fault.
  absl::Status Validate(int tensor_parallel_size, bool sequence_parallel) const;
  // The mixture-of-experts part of Validate (num_experts != 0).
  absl::Status ValidateMoe(int tensor_parallel_size,
                           bool sequence_parallel) const;
};

}  // namespace gpt
}  // namespace mcc

#endif  // MODELS_GPT_GPT_CONFIG_H_
