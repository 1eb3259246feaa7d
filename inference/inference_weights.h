#ifndef INFERENCE_INFERENCE_WEIGHTS_H_
#define INFERENCE_INFERENCE_WEIGHTS_H_

// The weights the inference engine computes with: one rank's part (its
// tensor-parallel shard of its pipeline stage's layers) of a trained GPT, as
// fp32 host arrays in the layouts of the training layers.

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "core/ops/moe_router.h"
#include "models/gpt/gpt_config.h"
#include "models/gpt/gpt_model.h"

namespace mcc {
namespace inference {

struct LinearWeights {
  std::vector<float> weight;  // [out (local), in (local)] row-major
  // Weight-only int8 instead (models/gpt/int8_quantization.h): q in the
  // weight's layout and fp32 per-output-row scales [out (local)]; weight is
  // then empty.
  std::vector<int8_t> q;
  std::vector<float> scales;
  // Weight-only FP8 (models/gpt/fp8_quantization.h): E4M3 codes in the
  // weight's layout and fp32 scales [out (local)] (w = e4m3(code) / scale),
  // for the engine on a device (inference/device_step.h); the CPU engine
  // computes with the dequantised values in weight, kept beside them.
  std::vector<int8_t> fp8_codes;
  std::vector<float> fp8_scales;
  std::vector<float> bias;  // Empty without bias; full for row-parallel.
  int64_t out = 0, in = 0;
};

struct NormWeights {
  std::vector<float> weight, bias;  // bias empty for RMSNorm
};

// A mixture-of-experts layer's MLP (models/moe/moe_mlp.h), whole on every
// rank (MoE layers run without tensor parallelism).
struct MoeWeights {
  ops::MoeRouterOptions router;
  std::vector<float> router_weight;      // [experts, hidden]
  std::vector<float> expert_bias;        // [experts]; empty without
  std::vector<LinearWeights> fc1, fc2;   // Per expert: [2f or f, h], [h, f].
  LinearWeights shared_fc1, shared_fc2;  // out == 0: no shared expert.
  // The shared expert's gate [hidden] (sigmoid(x . gate) scales it); empty
  // without.
  std::vector<float> shared_gate;
};

struct LayerWeights {
  NormWeights ln1, ln2;
  NormWeights q_norm, k_norm;         // --qk-layernorm: [head_dim]; else empty
  LinearWeights qkv, proj, fc1, fc2;  // fc1, fc2 empty in an MoE layer
  MoeWeights moe;                     // An MoE layer's (no experts: dense)
  bool is_moe() const { return !moe.fc1.empty(); }
};

struct InferenceWeights {
  gpt::GPTConfig config;
  int tp_size = 1, tp_rank = 0;
  int first_layer = 0;
  bool pre_process = true, post_process = true;
  int64_t local_heads = 0, local_groups = 0;
  // Rows [vocab_start, vocab_start + vocab_rows) of the padded vocabulary
  // (pre_process, or post_process with tied weights).
  std::vector<float> word_embeddings;
  int64_t vocab_start = 0, vocab_rows = 0;
  std::vector<float> position_embeddings;  // [max_positions, hidden]
  std::vector<LayerWeights> layers;
  NormWeights final_norm;     // post_process
  std::vector<float> output;  // Untied output layer, like word_embeddings.
  const std::vector<float>& head() const {
    return output.empty() ? word_embeddings : output;
  }
};

// The engine's only way to weights: copies `model`'s parameters (any dtype,
// any device) into fp32 host arrays; the linear layers of a model turned
// int8 (eval/serve --quantize int8, or a quantised checkpoint) are copied as
// int8 values and scales; those turned FP8 (--quantize fp8) as their
// dequantised fp32 values (the CPU engine has no FP8 kernel) and as their
// codes and scales (for the device engine). A step that
// transforms weights at load belongs here, after this copy.
absl::StatusOr<InferenceWeights> LoadInferenceWeights(
    const gpt::GPTModel& model);

}  // namespace inference
}  // namespace mcc

#endif  // INFERENCE_INFERENCE_WEIGHTS_H_
