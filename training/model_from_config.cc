#include "training/model_from_config.h"

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "core/status_macros.h"

namespace mcc {
namespace training {

absl::StatusOr<parallel::LayerContext::CpCommType> CpCommTypeFromConfig(
    const TrainConfig& config) {
  const std::string type = config.cp_comm_type();
  if (type == "p2p") return parallel::LayerContext::CpCommType::kP2P;
  if (type == "a2a") return parallel::LayerContext::CpCommType::kAllToAll;
  return absl::InvalidArgumentError(
      absl::StrCat("--cp-comm-type: '", type, "' is not p2p or a2a"));
}

absl::Status MoeFromConfig(const TrainConfig& config, gpt::GPTConfig* c) {
  c->num_experts = config.num_experts();
  c->moe_router_topk = config.moe_router_topk();
  c->moe_ffn_hidden_size = config.moe_ffn_hidden_size();
  c->moe_layer_freq = config.moe_layer_freq();
  c->moe_shared_expert_intermediate_size =
      config.moe_shared_expert_intermediate_size();
  const std::string score = config.moe_router_score_function();
  if (score == "sigmoid") {
    c->moe_router_score_function = ops::MoeScoreFunction::kSigmoid;
  } else if (score != "softmax") {
    return absl::InvalidArgumentError(
        absl::StrCat("--moe-router-score-function: '", score,
                     "' is not softmax or sigmoid"));
  }
  const std::string balancing = config.moe_router_load_balancing_type();
  if (balancing == "aux_loss") {
    c->moe_router_load_balancing_type = gpt::MoeLoadBalancing::kAuxLoss;
  } else if (balancing == "seq_aux_loss") {
    c->moe_router_load_balancing_type = gpt::MoeLoadBalancing::kSeqAuxLoss;
  } else if (balancing == "none") {
    c->moe_router_load_balancing_type = gpt::MoeLoadBalancing::kNone;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--moe-router-load-balancing-type: '", balancing,
                     "' is not aux_loss, seq_aux_loss or none (sinkhorn and "
                     "global_aux_loss are not built)"));
  }
  c->moe_aux_loss_coeff = config.moe_aux_loss_coeff();
  c->moe_z_loss_coeff = config.moe_z_loss_coeff();
  c->moe_router_enable_expert_bias = config.moe_router_enable_expert_bias();
  c->moe_shared_expert_gate = config.moe_shared_expert_gate();
  c->moe_router_pre_softmax = config.moe_router_pre_softmax();
  c->moe_router_bias_update_rate = config.moe_router_bias_update_rate();
  c->moe_expert_capacity_factor = config.moe_expert_capacity_factor();
  c->moe_token_drop_policy = config.moe_token_drop_policy();
  const std::string router_dtype = config.moe_router_dtype();
  if (!router_dtype.empty() && router_dtype != "fp32") {
    return absl::InvalidArgumentError(
        absl::StrCat("--moe-router-dtype: '", router_dtype,
                     "' is not fp32 (the router always computes in fp32)"));
  }
  const std::string dispatcher = config.moe_token_dispatcher_type();
  if (dispatcher != "allgather" && dispatcher != "alltoall") {
    return absl::InvalidArgumentError(
        absl::StrCat("--moe-token-dispatcher-type: '", dispatcher,
                     "' is not allgather or alltoall (flex is not built)"));
  }
  if (c->num_experts == 0) return absl::OkStatus();
  if (c->moe_router_bias_update_rate < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--moe-router-bias-update-rate (",
                     c->moe_router_bias_update_rate, ") must not be negative"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> WindowLeftOf(const std::string& window_size) {
  std::string text(absl::StripAsciiWhitespace(window_size));
  if (text.empty()) return -1;
  if (text.front() == '(' && text.back() == ')') {
    text = text.substr(1, text.size() - 2);
  }
  const std::vector<std::string> parts = absl::StrSplit(text, ',');
  int64_t left = 0, right = 0;
  if (parts.size() != 2 ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[0]), &left) ||
      !absl::SimpleAtoi(absl::StripAsciiWhitespace(parts[1]), &right)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--window-size: '", window_size, "' is not \"left,right\""));
  }
  if (right != 0 || left < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--window-size: '", window_size,
        "': only a left window with right 0 (\"L,0\", causal sliding "
        "window) is supported"));
  }
  return left;
}

absl::StatusOr<gpt::GPTConfig> GPTConfigFromConfig(const TrainConfig& config,
                                                   int64_t vocab_size) {
  gpt::GPTConfig c;
  c.num_layers = config.num_layers();
  c.hidden_size = config.hidden_size();
  c.num_attention_heads = config.num_attention_heads();
  if (config.group_query_attention()) {
    // Megatron's default is one group (multi-query attention).
    c.num_query_groups = std::max<int>(1, config.num_query_groups());
  }
  c.ffn_hidden_size = config.ffn_hidden_size();
  c.seq_length = config.seq_length();
  c.max_position_embeddings = config.max_position_embeddings();
  const std::string pos = config.position_embedding_type();
  if (pos == "rope") {
    c.position_embedding = gpt::PositionEmbedding::kRope;
  } else if (pos != "learned_absolute") {
    return absl::InvalidArgumentError(
        absl::StrCat("--position-embedding-type: '", pos,
                     "' is not learned_absolute or rope"));
  }
  c.rotary_base = config.rotary_base();
  c.rope_scaling.enabled = config.use_rope_scaling();
  c.rope_scaling.factor = config.rope_scaling_factor();
  c.rope_scaling.low_freq_factor = config.rope_scaling_low_freq_factor();
  c.rope_scaling.high_freq_factor = config.rope_scaling_high_freq_factor();
  c.rope_scaling.original_max_position_embeddings =
      config.rope_scaling_original_max_position_embeddings();
  const std::string norm = config.normalization();
  if (norm == "RMSNorm") {
    c.normalization = gpt::Normalization::kRMSNorm;
  } else if (norm != "LayerNorm") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--normalization: '", norm, "' is not LayerNorm or RMSNorm"));
  }
  c.norm_epsilon = config.norm_epsilon();
  if (config.swiglu()) c.activation = gpt::Activation::kSwiGLU;
  c.untie_embeddings_and_output_weights =
      config.untie_embeddings_and_output_weights();
  c.add_bias_linear = !config.disable_bias_linear();
  c.add_qkv_bias = config.add_qkv_bias();
  c.qk_layernorm = config.qk_layernorm();
  MCC_ASSIGN_OR_RETURN(c.window_left, WindowLeftOf(config.window_size()));
  c.hidden_dropout = config.hidden_dropout();
  c.attention_dropout = config.attention_dropout();
  c.init_method_std = config.init_method_std();
  c.vocab_size = vocab_size;
  // Padding for TP is the model's business (zero rows, no probability).
  c.make_vocab_size_divisible_by = config.make_vocab_size_divisible_by();
  c.seed = static_cast<uint64_t>(config.seed());
  const std::string granularity = config.recompute_granularity();
  if (granularity == "full") {
    c.recompute_granularity = gpt::RecomputeGranularity::kFull;
  } else if (granularity == "selective") {
    c.recompute_granularity = gpt::RecomputeGranularity::kSelective;
  } else if (!granularity.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--recompute-granularity: '", granularity,
                     "' is not full or selective"));
  }
  const std::string method = config.recompute_method();
  if (method == "block") {
    c.recompute_method = gpt::RecomputeMethod::kBlock;
  } else if (method != "uniform") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--recompute-method: '", method, "' is not uniform or block"));
  }
  c.recompute_num_layers = config.recompute_num_layers();
  c.cpu_offloading = config.cpu_offloading();
  c.cpu_offloading_num_layers = config.cpu_offloading_num_layers();
  if (config.bf16() && config.fp16()) {
    return absl::InvalidArgumentError("--bf16 and --fp16 exclude each other");
  }
  if (config.context_parallel_size() > 1) {
    const int64_t split = 2 * config.context_parallel_size();
    if (c.seq_length % split != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--seq-length ", c.seq_length, " must divide into 2 x ",
                       "--context-parallel-size = ", split, " equal chunks"));
    }
    if (c.attention_dropout > 0) {
      return absl::InvalidArgumentError(
          "--context-parallel-size > 1 needs --attention-dropout 0");
    }
  }
  MCC_RETURN_IF_ERROR(MoeFromConfig(config, &c));
  MCC_RETURN_IF_ERROR(CpCommTypeFromConfig(config).status());
  if (absl::Status s = c.Validate(config.tensor_model_parallel_size(),
                                  config.sequence_parallel());
      !s.ok()) {
    return s;
  }
  return c;
}

absl::StatusOr<pipeline::PipelineConfig> PipelineConfigFromConfig(
    const TrainConfig& config) {
  pipeline::PipelineConfig c;
  c.num_layers = config.num_layers();
  c.pipeline_size = config.pipeline_model_parallel_size();
  c.layers_per_virtual_stage = config.num_layers_per_virtual_pipeline_stage();
  c.first_stage_layers = config.decoder_first_pipeline_num_layers();
  c.last_stage_layers = config.decoder_last_pipeline_num_layers();
  // ZB-V places the two virtual stages of each stage in a V.
  c.v_shape = config.pipeline_schedule() == "zbv" && c.pipeline_size > 1;
  MCC_RETURN_IF_ERROR(pipeline::ValidatePipelineConfig(c));
  return c;
}

absl::StatusOr<std::optional<Fp8Recipe>> Fp8RecipeFromConfig(
    const TrainConfig& config) {
  if (config.fp8_format().empty()) return std::nullopt;
  MCC_ASSIGN_OR_RETURN(
      Fp8Recipe recipe,
      MakeFp8Recipe(config.fp8_format(), config.fp8_recipe(),
                    config.fp8_margin(), config.fp8_amax_history_len(),
                    config.fp8_amax_compute_algo()));
  return std::optional<Fp8Recipe>(recipe);
}

}  // namespace training
}  // namespace mcc
