#ifndef TOOLS_FLAGS_MOE_MODEL_FLAGS_H_
#define TOOLS_FLAGS_MOE_MODEL_FLAGS_H_

#include <cstdint>
#include <string>

#include "absl/flags/declare.h"

// Megatron-LM's mixture-of-experts model flags (issue 41), train's only:
// eval and serve take the model from the checkpoint. Read as TrainConfig
// fields of the same names (train_config_from_flags.h).
ABSL_DECLARE_FLAG(int32_t, num_experts);
ABSL_DECLARE_FLAG(int32_t, moe_router_topk);
ABSL_DECLARE_FLAG(int64_t, moe_ffn_hidden_size);
ABSL_DECLARE_FLAG(std::string, moe_layer_freq);
ABSL_DECLARE_FLAG(int64_t, moe_shared_expert_intermediate_size);
ABSL_DECLARE_FLAG(std::string, moe_router_score_function);
ABSL_DECLARE_FLAG(std::string, moe_router_load_balancing_type);
ABSL_DECLARE_FLAG(double, moe_aux_loss_coeff);
ABSL_DECLARE_FLAG(double, moe_z_loss_coeff);
ABSL_DECLARE_FLAG(bool, moe_router_enable_expert_bias);
ABSL_DECLARE_FLAG(bool, moe_shared_expert_gate);
ABSL_DECLARE_FLAG(bool, moe_router_pre_softmax);
ABSL_DECLARE_FLAG(double, moe_router_bias_update_rate);
ABSL_DECLARE_FLAG(bool, moe_grouped_gemm);
ABSL_DECLARE_FLAG(std::string, moe_router_dtype);
ABSL_DECLARE_FLAG(std::string, moe_token_dispatcher_type);

#endif  // TOOLS_FLAGS_MOE_MODEL_FLAGS_H_
