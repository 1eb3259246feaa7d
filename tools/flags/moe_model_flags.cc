#include "tools/flags/moe_model_flags.h"

#include "absl/flags/flag.h"

ABSL_FLAG(int32_t, num_experts, 0,
          "Experts of each mixture-of-experts layer (0: a dense model). "
          "Needs --disable-bias-linear.");
ABSL_FLAG(int32_t, moe_router_topk, 2,
          "Experts each token is routed to (1 to --num-experts).");
ABSL_FLAG(int64_t, moe_ffn_hidden_size, 0,
          "Each expert's hidden size (0: --ffn-hidden-size).");
ABSL_FLAG(std::string, moe_layer_freq, "1",
          "Which layers are MoE: an integer N (every Nth layer from the "
          "first) or a list of 0/1 per layer such as \"[1,0,1,0]\" or "
          "\"([0]+[1]*3)\".");
ABSL_FLAG(int64_t, moe_shared_expert_intermediate_size, 0,
          "Hidden size of a shared expert every token goes through (0: "
          "none).");
ABSL_FLAG(bool, moe_shared_expert_gate, false,
          "Scale the shared expert's output by sigmoid(x . w_g), a learned "
          "[1, hidden] gate (Qwen2-MoE's shared_expert_gate).");
ABSL_FLAG(bool, moe_router_pre_softmax, false,
          "Combine weights are the softmax over all experts' logits, not "
          "renormalised over the top-k (Qwen2-MoE's norm_topk_prob false; "
          "softmax scores only).");
ABSL_FLAG(std::string, moe_router_score_function, "softmax",
          "Router scores: softmax or sigmoid.");
ABSL_FLAG(std::string, moe_router_load_balancing_type, "aux_loss",
          "Balancing loss: aux_loss (over the micro-batch), seq_aux_loss "
          "(per sequence) or none; weighted by --moe-aux-loss-coeff.");
ABSL_FLAG(double, moe_aux_loss_coeff, 0.0,
          "Weight of the load-balancing loss (0: off).");
ABSL_FLAG(double, moe_z_loss_coeff, 0.0,
          "Weight of the router z-loss (0: off).");
ABSL_FLAG(bool, moe_router_enable_expert_bias, false,
          "DeepSeek-V3's aux-loss-free balancing: a per-expert bias that "
          "only chooses experts, stepped by --moe-router-bias-update-rate "
          "towards the mean load after every optimizer step.");
ABSL_FLAG(double, moe_router_bias_update_rate, 1e-3,
          "Step of the expert bias (with --moe-router-enable-expert-bias).");
ABSL_FLAG(bool, moe_grouped_gemm, false,
          "Megatron's grouped GEMM for the experts; here the experts always "
          "run as grouped GEMMs, so it changes nothing (warned).");
ABSL_FLAG(std::string, moe_router_dtype, "",
          "Router precision: fp32 (the router always computes in fp32 here; "
          "fp64 is refused).");
ABSL_FLAG(std::string, moe_token_dispatcher_type, "allgather",
          "How tokens reach their experts: allgather or alltoall (without "
          "expert parallelism every token stays on its rank and both are "
          "the same local permutation).");
