#include "models/gpt/model_config_proto.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "models/gpt/moe_layer_pattern.h"

namespace mcc {
namespace gpt {

checkpoint::ModelConfig ToProto(const gpt::GPTConfig& c, DType dtype) {
  checkpoint::ModelConfig p;
  p.set_num_layers(c.num_layers);
  p.set_hidden_size(static_cast<int32_t>(c.hidden_size));
  p.set_num_attention_heads(c.num_attention_heads);
  p.set_num_query_groups(c.query_groups());
  p.set_ffn_hidden_size(static_cast<int32_t>(c.ffn()));
  p.set_vocab_size(static_cast<int32_t>(c.vocab_size));
  p.set_padded_vocab_size(static_cast<int32_t>(c.vocab_size));
  p.set_seq_length(static_cast<int32_t>(c.seq_length));
  p.set_max_position_embeddings(static_cast<int32_t>(c.max_positions()));
  p.set_position_embedding_type(
      c.position_embedding == gpt::PositionEmbedding::kRope
          ? checkpoint::POSITION_EMBEDDING_ROPE
          : checkpoint::POSITION_EMBEDDING_LEARNED_ABSOLUTE);
  p.set_normalization(c.normalization == gpt::Normalization::kRMSNorm
                          ? checkpoint::NORMALIZATION_RMS_NORM
                          : checkpoint::NORMALIZATION_LAYER_NORM);
  p.set_activation(c.activation == gpt::Activation::kSwiGLU
                       ? checkpoint::ACTIVATION_SWIGLU
                       : checkpoint::ACTIVATION_GELU);
  p.set_tied_embeddings(!c.untie_embeddings_and_output_weights);
  p.set_add_bias_linear(c.add_bias_linear);
  p.set_add_qkv_bias(c.add_qkv_bias);
  p.set_qk_layernorm(c.qk_layernorm);
  p.set_sliding_window(c.sliding_window() ? c.window_left + 1 : 0);
  p.set_layernorm_epsilon(c.norm_epsilon);
  p.set_rotary_base(c.rotary_base);
  if (c.rope_scaling.enabled) {
    checkpoint::RopeScaling* r = p.mutable_rope_scaling();
    r->set_rope_type("llama3");
    r->set_factor(c.rope_scaling.factor);
    r->set_low_freq_factor(c.rope_scaling.low_freq_factor);
    r->set_high_freq_factor(c.rope_scaling.high_freq_factor);
    r->set_original_max_position_embeddings(
        c.rope_scaling.original_max_position_embeddings);
  }
  if (c.num_experts > 0) {
    p.set_num_experts(c.num_experts);
    p.set_moe_router_topk(c.moe_router_topk);
    p.set_moe_ffn_hidden_size(c.moe_ffn());
    auto pattern = ParseMoeLayerFreq(c.moe_layer_freq, c.num_layers);
    // An invalid frequency is kept as given (the model refuses it).
    p.set_moe_layer_pattern(pattern.ok() ? MoeLayerPatternString(*pattern)
                                         : c.moe_layer_freq);
    p.set_moe_shared_expert_intermediate_size(
        c.moe_shared_expert_intermediate_size);
    p.set_moe_router_score_function(c.moe_router_score_function ==
                                            ops::MoeScoreFunction::kSigmoid
                                        ? "sigmoid"
                                        : "softmax");
    p.set_moe_router_enable_expert_bias(c.moe_router_enable_expert_bias);
    p.set_moe_shared_expert_gate(c.moe_shared_expert_gate);
    p.set_moe_router_pre_softmax(c.moe_router_pre_softmax);
  }
  p.set_params_dtype(static_cast<int32_t>(dtype));
  return p;
}

absl::StatusOr<gpt::GPTConfig> FromProto(const checkpoint::ModelConfig& p) {
  gpt::GPTConfig c;
  c.num_layers = p.num_layers();
  c.hidden_size = p.hidden_size();
  c.num_attention_heads = p.num_attention_heads();
  c.num_query_groups = p.num_query_groups();
  c.ffn_hidden_size = p.ffn_hidden_size();
  c.vocab_size = p.vocab_size() > 0 ? p.vocab_size() : p.padded_vocab_size();
  c.seq_length = p.seq_length();
  c.max_position_embeddings = p.max_position_embeddings();
  c.position_embedding =
      p.position_embedding_type() == checkpoint::POSITION_EMBEDDING_ROPE
          ? gpt::PositionEmbedding::kRope
          : gpt::PositionEmbedding::kLearned;
  c.normalization = p.normalization() == checkpoint::NORMALIZATION_RMS_NORM
                        ? gpt::Normalization::kRMSNorm
                        : gpt::Normalization::kLayerNorm;
  c.activation = p.activation() == checkpoint::ACTIVATION_SWIGLU
                     ? gpt::Activation::kSwiGLU
                     : gpt::Activation::kGelu;
  c.untie_embeddings_and_output_weights = !p.tied_embeddings();
  c.add_bias_linear = p.add_bias_linear();
  c.add_qkv_bias = p.add_qkv_bias();
  c.qk_layernorm = p.qk_layernorm();
  if (p.sliding_window() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model config: sliding_window ", p.sliding_window(), " is negative"));
  }
  c.window_left = p.sliding_window() > 0 ? p.sliding_window() - 1 : -1;
  c.norm_epsilon = p.layernorm_epsilon();
  c.rotary_base = p.rotary_base();
  if (p.num_experts() != 0) {
    c.num_experts = p.num_experts();
    c.moe_router_topk = p.moe_router_topk();
    c.moe_ffn_hidden_size = p.moe_ffn_hidden_size();
    c.moe_layer_freq = p.moe_layer_pattern();
    c.moe_shared_expert_intermediate_size =
        p.moe_shared_expert_intermediate_size();
    const std::string& score = p.moe_router_score_function();
    if (score == "sigmoid") {
      c.moe_router_score_function = ops::MoeScoreFunction::kSigmoid;
    } else if (score != "softmax") {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: moe_router_score_function '", score,
                       "' is not softmax or sigmoid"));
    }
    c.moe_router_enable_expert_bias = p.moe_router_enable_expert_bias();
    c.moe_shared_expert_gate = p.moe_shared_expert_gate();
    c.moe_router_pre_softmax = p.moe_router_pre_softmax();
  }
  if (p.has_rope_scaling()) {
    const checkpoint::RopeScaling& r = p.rope_scaling();
    if (r.rope_type() != "llama3") {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: rope_scaling type '", r.rope_type(),
                       "' is not supported (only llama3)"));
    }
    c.rope_scaling.enabled = true;
    c.rope_scaling.factor = r.factor();
    c.rope_scaling.low_freq_factor = r.low_freq_factor();
    c.rope_scaling.high_freq_factor = r.high_freq_factor();
    c.rope_scaling.original_max_position_embeddings =
        r.original_max_position_embeddings();
    const absl::Status valid = ops::ValidateLlama3RopeScaling(c.rope_scaling);
    if (!valid.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("model config: ", valid.message()));
    }
  }
  return c;
}

absl::Status CheckConfigFitsCheckpoint(const gpt::GPTConfig& config,
                                       int64_t checkpoint_bytes,
                                       const std::string& path) {
  const std::pair<const char*, int64_t> sizes[] = {
      {"num_layers", config.num_layers},
      {"hidden_size", config.hidden_size},
      {"num_attention_heads", config.num_attention_heads},
      {"vocab_size", config.vocab_size},
      {"ffn_hidden_size", config.ffn()}};
  for (const auto& [name, value] : sizes) {
    if (value <= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("checkpoint ", path, ": its model config has ", name,
                       " ", value, " (must be positive)"));
    }
  }
  const double h = static_cast<double>(config.hidden_size);
  // A layer's MLP: dense, or (MoE) at least its experts' two projections;
  // the smaller of the two bounds any layer pattern.
  double mlp = static_cast<double>(config.ffn());
  if (config.num_experts > 0) {
    mlp = std::min(mlp, static_cast<double>(config.num_experts) *
                            static_cast<double>(config.moe_ffn()));
  }
  const double elements =
      static_cast<double>(config.vocab_size) * h +
      static_cast<double>(config.num_layers) * (2 * h * h + 2 * h * mlp);
  if (elements > static_cast<double>(checkpoint_bytes)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint %s: its model config (%d layers, hidden %d, FFN %d, "
        "vocabulary %d) has at least %.3g parameters, but its shard files "
        "hold %d bytes: metadata.pb is damaged or not this checkpoint's",
        path, config.num_layers, config.hidden_size, config.ffn(),
        config.vocab_size, elements, checkpoint_bytes));
  }
  return absl::OkStatus();
}

}  // namespace gpt
}  // namespace mcc
