#include "training/model_from_config.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
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
  MCC_RETURN_IF_ERROR(pipeline::ValidatePipelineConfig(c));
  return c;
}

}  // namespace training
}  // namespace mcc
