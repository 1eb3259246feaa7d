#ifndef TOOLS_FLAGS_TRAINING_FLAGS_H_
#define TOOLS_FLAGS_TRAINING_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

// Megatron-LM's flags shared by the train, eval, serve and plan binaries.
// Abseil names use underscores; the binaries also accept Megatron's dashed
// spelling. A binary reads them as a TrainConfig
// (train_config_from_flags.h); training/model_from_config.h turns that into
// the model.

// Model.
ABSL_DECLARE_FLAG(int32_t, num_layers);
ABSL_DECLARE_FLAG(int64_t, hidden_size);
ABSL_DECLARE_FLAG(int32_t, num_attention_heads);
ABSL_DECLARE_FLAG(int32_t, num_query_groups);
ABSL_DECLARE_FLAG(bool, group_query_attention);
ABSL_DECLARE_FLAG(int64_t, ffn_hidden_size);
ABSL_DECLARE_FLAG(int64_t, seq_length);
ABSL_DECLARE_FLAG(int64_t, max_position_embeddings);
ABSL_DECLARE_FLAG(std::string, position_embedding_type);
ABSL_DECLARE_FLAG(double, rotary_base);
ABSL_DECLARE_FLAG(bool, use_rope_scaling);
ABSL_DECLARE_FLAG(double, rope_scaling_factor);
ABSL_DECLARE_FLAG(double, rope_scaling_low_freq_factor);
ABSL_DECLARE_FLAG(double, rope_scaling_high_freq_factor);
ABSL_DECLARE_FLAG(int64_t, rope_scaling_original_max_position_embeddings);
ABSL_DECLARE_FLAG(std::string, normalization);
ABSL_DECLARE_FLAG(double, norm_epsilon);
ABSL_DECLARE_FLAG(bool, swiglu);
ABSL_DECLARE_FLAG(bool, untie_embeddings_and_output_weights);
ABSL_DECLARE_FLAG(bool, disable_bias_linear);
ABSL_DECLARE_FLAG(bool, add_qkv_bias);
ABSL_DECLARE_FLAG(bool, qk_layernorm);
ABSL_DECLARE_FLAG(double, hidden_dropout);
ABSL_DECLARE_FLAG(double, attention_dropout);
ABSL_DECLARE_FLAG(double, init_method_std);
ABSL_DECLARE_FLAG(int64_t, vocab_size);
ABSL_DECLARE_FLAG(int32_t, make_vocab_size_divisible_by);
ABSL_DECLARE_FLAG(std::string, recompute_granularity);
ABSL_DECLARE_FLAG(std::string, recompute_method);
ABSL_DECLARE_FLAG(int32_t, recompute_num_layers);
ABSL_DECLARE_FLAG(bool, cpu_offloading);
ABSL_DECLARE_FLAG(int32_t, cpu_offloading_num_layers);
ABSL_DECLARE_FLAG(bool, cuda_graph);
ABSL_DECLARE_FLAG(int32_t, seed);
ABSL_DECLARE_FLAG(bool, bf16);
ABSL_DECLARE_FLAG(bool, fp16);

// Parallelism.
ABSL_DECLARE_FLAG(int32_t, tensor_model_parallel_size);
ABSL_DECLARE_FLAG(int32_t, pipeline_model_parallel_size);
ABSL_DECLARE_FLAG(int32_t, context_parallel_size);
ABSL_DECLARE_FLAG(std::string, cp_comm_type);
ABSL_DECLARE_FLAG(int32_t, expert_model_parallel_size);
ABSL_DECLARE_FLAG(int32_t, expert_tensor_parallel_size);
ABSL_DECLARE_FLAG(double, moe_expert_capacity_factor);
ABSL_DECLARE_FLAG(std::string, moe_token_drop_policy);
ABSL_DECLARE_FLAG(bool, moe_pack_expert_weights);
ABSL_DECLARE_FLAG(bool, sequence_parallel);
ABSL_DECLARE_FLAG(int32_t, num_layers_per_virtual_pipeline_stage);
ABSL_DECLARE_FLAG(int32_t, decoder_first_pipeline_num_layers);
ABSL_DECLARE_FLAG(int32_t, decoder_last_pipeline_num_layers);
ABSL_DECLARE_FLAG(bool, no_overlap_p2p_communication);
ABSL_DECLARE_FLAG(double, distributed_timeout_minutes);

// Data.
ABSL_DECLARE_FLAG(std::string, data_path);
ABSL_DECLARE_FLAG(std::string, split);
ABSL_DECLARE_FLAG(bool, mock_data);
ABSL_DECLARE_FLAG(std::string, tokenizer_type);
ABSL_DECLARE_FLAG(std::string, vocab_file);
ABSL_DECLARE_FLAG(std::string, merge_file);
ABSL_DECLARE_FLAG(std::string, tokenizer_model);
ABSL_DECLARE_FLAG(std::string, data_cache_path);
ABSL_DECLARE_FLAG(bool, eod_mask_loss);
ABSL_DECLARE_FLAG(bool, reset_position_ids);
ABSL_DECLARE_FLAG(bool, reset_attention_mask);
ABSL_DECLARE_FLAG(std::string, window_size);
ABSL_DECLARE_FLAG(int32_t, micro_batch_size);

#endif  // TOOLS_FLAGS_TRAINING_FLAGS_H_
