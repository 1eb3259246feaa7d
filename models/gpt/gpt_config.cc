#include "models/gpt/gpt_config.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status_macros.h"
#include "models/gpt/moe_layer_pattern.h"

namespace mcc {
namespace gpt {

bool GPTConfig::IsLlama() const {
  return normalization == Normalization::kRMSNorm &&
         activation == Activation::kSwiGLU &&
         position_embedding == PositionEmbedding::kRope &&
         untie_embeddings_and_output_weights && !add_bias_linear;
}

std::string GPTConfig::Architecture() const {
  std::vector<std::string> choices;
  if (normalization == Normalization::kRMSNorm) choices.push_back("RMSNorm");
  if (activation == Activation::kSwiGLU) choices.push_back("SwiGLU");
  if (position_embedding == PositionEmbedding::kRope) {
    choices.push_back(rope_scaling.enabled ? "RoPE llama3-scaled" : "RoPE");
  }
  if (query_groups() != num_attention_heads) {
    choices.push_back(
        absl::StrCat("GQA ", num_attention_heads, "/", query_groups()));
  }
  if (qk_layernorm) choices.push_back("QK-norm");
  if (num_experts > 0) {
    choices.push_back(absl::StrCat(
        "MoE ", num_experts, " experts top-", moe_router_topk,
        moe_shared_expert_intermediate_size > 0
            ? (moe_shared_expert_gate ? " + gated shared" : " + shared")
            : ""));
  }
  if (sliding_window()) {
    choices.push_back(absl::StrCat("sliding window ", window_left + 1));
  }
  if (untie_embeddings_and_output_weights) choices.push_back("untied");
  if (!add_bias_linear) {
    choices.push_back(add_qkv_bias ? "QKV bias only" : "no bias");
  }
  const std::string name = IsLlama() ? "Llama" : "GPT";
  if (choices.empty()) return name;
  return absl::StrCat(name, " (", absl::StrJoin(choices, ", "), ")");
}

absl::Status GPTConfig::Validate(int tp, bool sequence_parallel) const {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (num_layers <= 0 || hidden_size <= 0 || num_attention_heads <= 0 ||
      vocab_size <= 0 || seq_length <= 0) {
    return bad("--num-layers (", num_layers, "), --hidden-size (", hidden_size,
               "), --num-attention-heads (", num_attention_heads,
               "), vocabulary (", vocab_size, ") and --seq-length (",
               seq_length, ") must be positive");
  }
  if (hidden_size % num_attention_heads != 0) {
    return bad("--hidden-size (", hidden_size,
               ") is not divisible by --num-attention-heads (",
               num_attention_heads, ")");
  }
  if (num_attention_heads % query_groups() != 0) {
    return bad("--num-attention-heads (", num_attention_heads,
               ") is not divisible by --num-query-groups (", query_groups(),
               ")");
  }
  if (num_attention_heads % tp != 0) {
    return bad("--num-attention-heads (", num_attention_heads,
               ") is not divisible by --tensor-model-parallel-size (", tp, ")");
  }
  if (query_groups() % tp != 0) {
    return bad("--num-query-groups (", query_groups(),
               ") is not divisible by --tensor-model-parallel-size (", tp, ")");
  }
  if (ffn() % tp != 0) {
    return bad("--ffn-hidden-size (", ffn(),
               ") is not divisible by --tensor-model-parallel-size (", tp, ")");
  }
  if (make_vocab_size_divisible_by <= 0) {
    return bad("--make-vocab-size-divisible-by (", make_vocab_size_divisible_by,
               ") must be positive");
  }
  if (sequence_parallel && seq_length % tp != 0) {
    return bad("--seq-length (", seq_length,
               ") is not divisible by --tensor-model-parallel-size (", tp,
               ") as --sequence-parallel needs");
  }
  if (seq_length > max_positions()) {
    return bad("--seq-length (", seq_length,
               ") exceeds --max-position-embeddings (", max_positions(), ")");
  }
  if (attention_dropout < 0.0 || attention_dropout >= 1.0) {
    return bad("--attention-dropout ", attention_dropout, " is not in [0, 1)");
  }
  if (hidden_dropout < 0.0 || hidden_dropout >= 1.0) {
    return bad("--hidden-dropout ", hidden_dropout, " is not in [0, 1)");
  }
  if (position_embedding == PositionEmbedding::kRope && head_dim() % 2 != 0) {
    return bad("rotary embeddings need an even head dimension, got ",
               head_dim());
  }
  if (rope_scaling.enabled) {
    if (position_embedding != PositionEmbedding::kRope) {
      return bad("--use-rope-scaling needs --position-embedding-type rope");
    }
    const absl::Status scaling = ops::ValidateLlama3RopeScaling(rope_scaling);
    if (!scaling.ok()) return bad("--use-rope-scaling: ", scaling.message());
  }
  if (window_left < -1) {
    return bad("--window-size left ", window_left, " must be >= 0");
  }
  if (window_left >= seq_length) {
    return bad("--window-size ", window_left,
               ",0 covers the whole --seq-length ", seq_length,
               ": leave the window out");
  }
  if (recompute_num_layers <= 0) {
    return bad("--recompute-num-layers (", recompute_num_layers,
               ") must be positive");
  }
  if (cpu_offloading_num_layers < 0 ||
      (cpu_offloading && cpu_offloading_num_layers > num_layers)) {
    return bad("--cpu-offloading-num-layers (", cpu_offloading_num_layers,
               ") must be in [0, --num-layers ", num_layers, "]");
  }
  if (num_experts != 0) MCC_RETURN_IF_ERROR(ValidateMoe(tp, sequence_parallel));
  return absl::OkStatus();
}

bool GPTConfig::IsMoeLayer(int layer) const {
  if (num_experts <= 0) return false;
  auto pattern = ParseMoeLayerFreq(moe_layer_freq, num_layers);
  return pattern.ok() && layer >= 0 && layer < num_layers && (*pattern)[layer];
}

absl::Status GPTConfig::ValidateMoe(int tp, bool sequence_parallel) const {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat(parts...));
  };
  if (num_experts < 1) {
    return bad("--num-experts (", num_experts, ") must be positive");
  }
  if (moe_router_topk < 1 || moe_router_topk > num_experts) {
    return bad("--moe-router-topk (", moe_router_topk,
               ") must be in [1, --num-experts ", num_experts, "]");
  }
  if (moe_ffn_hidden_size < 0 || moe_shared_expert_intermediate_size < 0) {
    return bad("--moe-ffn-hidden-size (", moe_ffn_hidden_size,
               ") and --moe-shared-expert-intermediate-size (",
               moe_shared_expert_intermediate_size, ") must not be negative");
  }
  MCC_RETURN_IF_ERROR(ParseMoeLayerFreq(moe_layer_freq, num_layers).status());
  if (moe_aux_loss_coeff < 0 || moe_z_loss_coeff < 0) {
    return bad("--moe-aux-loss-coeff (", moe_aux_loss_coeff,
               ") and --moe-z-loss-coeff (", moe_z_loss_coeff,
               ") must not be negative");
  }
  if (add_bias_linear) {
    return bad(
        "--num-experts: the experts have no biases; give "
        "--disable-bias-linear");
  }
  if (tp > 1 && sequence_parallel && moe_expert_capacity_factor > 0) {
    // Under SP each TP rank routes its own part of the sequences and would
    // drop over that part, not over the micro-batch as the serial run does.
    return bad(
        "--moe-expert-capacity-factor with --sequence-parallel "
        "(tensor-parallel size ",
        tp, ") is not built: give a dropless run (0)");
  }
  return absl::OkStatus();
}

}  // namespace gpt
}  // namespace mcc
